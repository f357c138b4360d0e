#!/usr/bin/env bash
# Starts a local three-member etcd cluster (Debian's etcd-server, `apt-get install etcd-server`)
# to measure Baton against, and stops it on Ctrl-C:
#   bash jepsen/scripts/etcd-cluster.sh [DATA_DIR]
# Clients (and the JSON gateway, /v3/...) on 127.0.0.1:2379, :22379, :32379; peers on
# :2380, :22380, :32380. Data in DATA_DIR (default ./etcd-cluster), fsynced as etcd does by
# default. Then: baton-jepsen bench --workload leases --endpoints ... \
#   --etcd http://127.0.0.1:2379,http://127.0.0.1:22379,http://127.0.0.1:32379
set -euo pipefail
data_dir=${1:-./etcd-cluster}
command -v etcd >/dev/null || { echo "etcd is not installed: apt-get install etcd-server" >&2; exit 1; }
members="e1=http://127.0.0.1:2380,e2=http://127.0.0.1:22380,e3=http://127.0.0.1:32380"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT INT TERM
client_ports=(2379 22379 32379)
peer_ports=(2380 22380 32380)
mkdir -p "$data_dir"
for member in 1 2 3; do
  client="http://127.0.0.1:${client_ports[$((member - 1))]}"
  peer="http://127.0.0.1:${peer_ports[$((member - 1))]}"
  etcd --name "e$member" --data-dir "$data_dir/e$member" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$members" --initial-cluster-state new \
    --initial-cluster-token baton-bench 2>>"$data_dir/e$member.log" &
  pids+=($!)
done
echo "etcd cluster: http://127.0.0.1:2379, :22379, :32379 (logs in $data_dir/e*.log). Ctrl-C stops it." >&2
wait
