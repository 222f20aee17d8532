#!/usr/bin/env bash
# Round 137 (device machine, 2026-12-07). Issue 15: the relay's default rule as built
# (4-16 ranks, 2-8 MiB malloc'd, 256 KiB-4 MiB ncclMemAlloc, 512 KiB from 9 ranks) against the rule before it
# (FERROCCL_NODE_RELAY_MIN=1T: no relay) and Open MPI, all-gathers 256 KiB-16 MiB at 4, 8 and
# 16 ranks, fresh and reused inputs, malloc'd and ncclMemAlloc. Two alternations.
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
  timeout 40 mpirun -np $np --bind-to none "$@" -b 256K -e 16M -f 2 -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
OFF="-x FERROCCL_NODE_RELAY_MIN=1T"
for i in 1 2; do for np in 8 16 4; do for m in fresh reused; do
  before 200 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $np $B all_gather $f
  line norelay-$m $np $OFF $B all_gather $f
  line nccl-$m $np $B all_gather --alloc nccl $f
  line ncnorelay-$m $np $OFF $B all_gather --alloc nccl $f
  line ompi-$m $np /tmp/ompi_bench -C all_gather $f
done; done; done 2>&1 | tee $R/ag.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
