#!/usr/bin/env bash
# Round 136 (device machine, 2026-12-07, right after round 135 on the same machine). Issue 15:
# the relay's rule. All-gathers 64 KiB-16 MiB at 4, 8 and 16 ranks, fresh and reused inputs:
# the current rule (slots to 1 MiB, pull by kernel copies above), the relay above the rule
# (FERROCCL_NODE_RELAY_MIN=0: every all-gather no rank stages), the relay above slots to 512
# KiB, ncclMemAlloc by pull and by relay (relay at every direct size), Open MPI. Three
# alternations.
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
  timeout 40 mpirun -np $np --bind-to none "$@" -b 64K -e 16M -f 2 -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
RL="-x FERROCCL_NODE_RELAY_MIN=0"; S5="-x FERROCCL_NODE_STAGE_MAX=512K -x FERROCCL_NODE_RELAY_MIN=0"
for i in 1 2 3; do for np in 8 16 4; do for m in fresh reused; do
  before 250 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $np $B all_gather $f
  line relay-$m $np $RL $B all_gather $f
  line s512relay-$m $np $S5 $B all_gather $f
  line nccl-$m $np $B all_gather --alloc nccl $f
  line ncrelay-$m $np $RL $B all_gather --alloc nccl $f
  line ompi-$m $np /tmp/ompi_bench -C all_gather $f
done; done; done 2>&1 | tee $R/ag.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
