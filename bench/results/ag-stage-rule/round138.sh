#!/usr/bin/env bash
# Round 138 (device machine; prepared 2026-12-07, not run: the session's device time ran out). Issue 15:
# malloc'd all-gathers at 512 KiB-1 MiB,
# where the default's slots now trail ncclMemAlloc's relay (4 ranks 512 KiB 84 against 54 us
# in round 137). At 4, 8 and 16 ranks, 128 KiB-4 MiB, fresh and reused inputs: the default
# (dc32ad7: slots to 1 MiB, the pull at 1-2 MiB, relay at 2-8 MiB), slots to 256 KiB and relay
# from 512 KiB (r512), slots to 512 KiB and relay from 1 MiB (r1m), ncclMemAlloc's default,
# Open MPI. And 3 ranks (no relay by default): the default against relay wherever nobody
# stages, for both kinds of buffers. Up to three alternations (stopped at 140 s).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, program and its arguments
  local l=$1 np=$2; shift 2
  printf "%-14s np%-2s all_gather " $l $np
  timeout 40 mpirun -np $np --bind-to none "$@" -b 128K -e 4M -f 2 -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
R512="-x FERROCCL_NODE_STAGE_MAX=256K -x FERROCCL_NODE_RELAY_MIN=512K"
R1M="-x FERROCCL_NODE_STAGE_MAX=512K -x FERROCCL_NODE_RELAY_MIN=1M"
ALL="-x FERROCCL_NODE_RELAY_MIN=0"
for i in 1 2 3; do for np in 4 8 16 3; do for m in fresh reused; do
  before 140 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $np $B all_gather $f
  if [ $np = 3 ]; then
    line relay-$m $np $ALL $B all_gather $f
    line nccl-$m $np $B all_gather --alloc nccl $f
    line ncrelay-$m $np $ALL $B all_gather --alloc nccl $f
  else
    line r512-$m $np $R512 $B all_gather $f
    line r1m-$m $np $R1M $B all_gather $f
    line nccl-$m $np $B all_gather --alloc nccl $f
  fi
  line ompi-$m $np /tmp/ompi_bench -C all_gather $f
done; done; done 2>&1 | tee $R/ag.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
