#!/bin/sh
# Tests of the Python client, against a real cluster started from $BATOND.
# Run from the repository root:  BATOND=target/release/batond client/python/run-tests.sh
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
: "${BATOND:=$root/target/release/batond}"
case $BATOND in /*) ;; *) BATOND=$(pwd)/$BATOND ;; esac
export BATOND
if [ ! -x "$BATOND" ]; then
    echo "run-tests.sh: no batond binary at $BATOND (set BATOND)" >&2
    exit 2
fi

venv=${BATON_PY_VENV:-$(mktemp -d "${TMPDIR:-/tmp}/baton-py-venv.XXXXXX")}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "$here[dev]"

cd "$here"
"$venv/bin/python" -m mypy --strict src/baton
"$venv/bin/python" -m pytest -q "$here" -p no:cacheprovider
