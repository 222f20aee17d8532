#!/usr/bin/env bash
# The soak (examples/soak.rs) on each path: node area, shared memory, sockets, and TLS
# sockets (a build with openssl3). 10,000 random collectives over 4 ranks each by default.
#   bench/soak.sh [OPS] [RANKS]   (CARGO_TARGET_DIR respected; writes to stdout)
set -euo pipefail
ops=${1:-10000}
ranks=${2:-4}
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q --example soak
cp "$target/release/examples/soak" "$target/release/examples/soak-plain"
cargo build --release -q --example soak --features openssl3
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)"
run() {
  local label=$1
  shift
  echo "## $label"
  echo "\$ $*"
  env "$@"
  echo
}
run "node area" "$target/release/examples/soak-plain" --ops "$ops" --ranks "$ranks"
run "shared memory" FERROCCL_NODE_COLL=0 "$target/release/examples/soak-plain" --ops "$ops" --ranks "$ranks"
run "sockets" FERROCCL_NODE_COLL=0 NCCL_SHM_DISABLE=1 "$target/release/examples/soak-plain" --ops "$ops" --ranks "$ranks"
run "TLS sockets" FERROCCL_NODE_COLL=0 NCCL_SHM_DISABLE=1 "$target/release/examples/soak" --ops "$ops" --ranks "$ranks" \
  --psk "soak-pre-shared-key-0123456789abcdef"
