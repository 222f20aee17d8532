#!/usr/bin/env bash
# 8-byte all-reduce time of two ferroccl-bench builds, alternating runs (old, new, old, ...):
# 2 ranks as threads, on the node area, shared memory (FERROCCL_NODE_COLL=0) and sockets
# (also NCCL_SHM_DISABLE=1). Prints "config version run out-of-place-us in-place-us".
#   [CHRT="chrt -f 10"] bench/alternate_8b.sh OLD_BINARY NEW_BINARY [RUNS] [ITERS]
# CHRT runs each benchmark under that prefix: real-time priority keeps other jobs of a shared
# machine from landing between the two spinning ranks (which otherwise dominates at 8 B).
set -uo pipefail
old=$1 new=$2 runs=${3:-5} iters=${4:-20000}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
echo "# host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for cfg in node shm sockets; do
  case $cfg in
    node) env=() ;;
    shm) env=(FERROCCL_NODE_COLL=0) ;;
    sockets) env=(FERROCCL_NODE_COLL=0 NCCL_SHM_DISABLE=1) ;;
  esac
  for r in $(seq "$runs"); do
    for v in old new; do
      bin=$old
      [ "$v" = new ] && bin=$new
      line=$(env "${env[@]}" ${CHRT:-} timeout 120 "$bin" all_reduce -t 2 -b 8 -e 8 -n "$iters" -w 2000 2>&1 | grep -E '^ +8 ')
      echo "$cfg $v $r $(echo "$line" | awk '{print $6, $10}')"
    done
  done
done
