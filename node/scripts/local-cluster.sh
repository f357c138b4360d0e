#!/usr/bin/env bash
# Starts a local three-node Baton cluster for trying things out, and stops it on Ctrl-C.
#   bash node/scripts/local-cluster.sh [DATA_DIR]
# Client API on 127.0.0.1:7431..7433, peer RPC on 127.0.0.1:7441..7443. Data in DATA_DIR
# (default ./baton-cluster), so a second run resumes the same cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."
data_dir=${1:-./baton-cluster}
cargo build --release -p baton-node --bin batond
members="1=127.0.0.1:7431@127.0.0.1:7441,2=127.0.0.1:7432@127.0.0.1:7442,3=127.0.0.1:7433@127.0.0.1:7443"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT INT TERM
for id in 1 2 3; do
  mkdir -p "$data_dir/node-$id"
  ./target/release/batond run --id "$id" --data-dir "$data_dir/node-$id" \
    --listen "127.0.0.1:743$id" --peer-listen "127.0.0.1:744$id" \
    --initial-cluster "$members" 2>>"$data_dir/node-$id.log" &
  pids+=($!)
done
echo "Baton cluster: http://127.0.0.1:7431, :7432, :7433 (logs in $data_dir/node-*.log). Ctrl-C stops it." >&2
wait
