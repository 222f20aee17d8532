#!/usr/bin/env bash
# Round 132 (device machine, 2026-12-06/07 night). Issue 15: the all-gather's stage rule, with
# fresh and reused inputs in the same run (round 131 measured fresh only, round 98 reused only,
# and they disagreed). 4, 8 and 16 ranks, 32 KiB-4 MiB per rank, malloc'd buffers:
# FERROCCL_NODE_STAGE_MAX unset (64 KiB at 3-8 ranks, 1 MiB at 16) against 4M (every size
# through the node area's slots), next to ncclMemAlloc buffers and Open MPI, two alternations.
# Then the 2-rank small broadcast against Open MPI (issue 15's 0.71x at 8 B).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u;
  cat /sys/kernel/mm/transparent_hugepage/enabled; } > $R/host.txt 2>&1
cat $R/host.txt
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, collective, sizes, program and its arguments
  local l=$1 np=$2 c=$3 s=$4; shift 4
  printf "%-10s np%-2s %-10s " $l $np $c
  timeout 40 mpirun -np $np --bind-to none "$@" $s -n 200 -w 20 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
AG="-b 32K -e 4M -f 2"
for i in 1 2; do for np in 8 16 4; do for m in fresh reused; do
  before 200 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $np all_gather "$AG" $B all_gather $f
  line s4m-$m $np all_gather "$AG" -x FERROCCL_NODE_STAGE_MAX=4M $B all_gather $f
  line nccl-$m $np all_gather "$AG" $B all_gather --alloc nccl $f
  [ $i = 1 ] && line ompi-$m $np all_gather "$AG" /tmp/ompi_bench -C all_gather $f
done; done; done 2>&1 | tee $R/ag-stage.txt
el "all-gather stage"
for i in 1 2 3; do
  before 230 || break
  line dflt 2 broadcast "-b 8 -e 1K -f 4" $B broadcast
  line ompi 2 broadcast "-b 8 -e 1K -f 4" /tmp/ompi_bench -C broadcast
done 2>&1 | tee $R/bcast2.txt
el "bcast"
cd $OUT && tar czf r.tgz r && rm -rf r
