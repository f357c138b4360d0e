#!/bin/sh
# Runs the TypeScript client's checks and tests against real batond processes.
# From the repository root: BATOND=target/release/batond client/typescript/run-tests.sh
set -eu
if [ -z "${BATOND:-}" ]; then
    echo "run-tests.sh: set BATOND to a batond binary" >&2
    exit 2
fi
case "$BATOND" in
    /*) ;;
    *) BATOND="$(pwd)/$BATOND" ;;
esac
if [ ! -f "$BATOND" ] || [ ! -x "$BATOND" ]; then
    echo "run-tests.sh: BATOND=$BATOND is not an executable file" >&2
    exit 2
fi
export BATOND
cd "$(dirname "$0")"
npm ci
npm run check:generated
npm run typecheck
npm test
