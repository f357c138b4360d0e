#!/usr/bin/env bash
# Starts a local three-node Baton cluster for trying things out, and stops it on Ctrl-C.
#   bash node/scripts/local-cluster.sh [--secure] [DATA_DIR]
# Client API on 127.0.0.1:7431..7433, peer RPC on 127.0.0.1:7441..7443. Data in DATA_DIR
# (default ./baton-cluster), so a second run resumes the same cluster.
#
# --secure: access control and TLS. On the first run it makes a CA, a certificate for
# 127.0.0.1 and a bootstrap admin token under DATA_DIR/certs (with openssl); every node then
# runs with --auth, serves HTTPS and talks to its peers over mutual TLS. It prints the
# BATON_ENDPOINTS, BATON_CA_FILE and BATON_TOKEN to export for `baton`.
set -euo pipefail
cd "$(dirname "$0")/../.."
secure=false
if [ "${1:-}" = "--secure" ]; then
  secure=true
  shift
fi
data_dir=${1:-./baton-cluster}
cargo build --release -p baton-node --bin batond
members="1=127.0.0.1:7431@127.0.0.1:7441,2=127.0.0.1:7432@127.0.0.1:7442,3=127.0.0.1:7433@127.0.0.1:7443"
extra=()
scheme=http
if $secure; then
  command -v openssl >/dev/null || { echo "--secure makes its certificates with openssl: apt-get install openssl" >&2; exit 1; }
  certs="$data_dir/certs"
  mkdir -p "$certs"
  if [ ! -f "$certs/node.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
      -subj "/CN=Baton local CA" -keyout "$certs/ca-key.pem" -out "$certs/ca.pem" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=Baton local node" \
      -keyout "$certs/node-key.pem" -out "$certs/node.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' >"$certs/node.ext"
    openssl x509 -req -in "$certs/node.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca-key.pem" \
      -CAcreateserial -days 365 -extfile "$certs/node.ext" -out "$certs/node.pem" 2>/dev/null
    (umask 077 && openssl rand -hex 24 >"$certs/bootstrap-token")
  fi
  extra=(--auth --tls-cert "$certs/node.pem" --tls-key "$certs/node-key.pem"
    --peer-tls-cert "$certs/node.pem" --peer-tls-key "$certs/node-key.pem" --peer-ca "$certs/ca.pem")
  BATON_BOOTSTRAP_TOKEN=$(cat "$certs/bootstrap-token")
  export BATON_BOOTSTRAP_TOKEN
  scheme=https
fi
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT INT TERM
for id in 1 2 3; do
  mkdir -p "$data_dir/node-$id"
  ./target/release/batond run --id "$id" --data-dir "$data_dir/node-$id" \
    --listen "127.0.0.1:743$id" --peer-listen "127.0.0.1:744$id" \
    --initial-cluster "$members" "${extra[@]}" 2>>"$data_dir/node-$id.log" &
  pids+=($!)
done
echo "Baton cluster: $scheme://127.0.0.1:7431, :7432, :7433 (logs in $data_dir/node-*.log). Ctrl-C stops it." >&2
if $secure; then
  cat >&2 <<MSG
For baton, as the bootstrap admin:
  export BATON_ENDPOINTS=https://127.0.0.1:7431,https://127.0.0.1:7432,https://127.0.0.1:7433
  export BATON_CA_FILE=$(cd "$certs" && pwd)/ca.pem
  export BATON_TOKEN=$(cat "$certs/bootstrap-token")
MSG
fi
wait
