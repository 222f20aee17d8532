#!/usr/bin/env bash
# Round 135 (device machine, 2026-12-07). Issue 15: why Open MPI beats both all-gather paths at
# 2 MiB with fresh inputs (round 132). 8 and 16 ranks, fresh inputs, 512 KiB-4 MiB: the rule
# (slots to 1 MiB, kernel copies above), slots at every size with the default 1 MiB slot and
# with 4 MiB slots (fewer rounds and synchronisations), Open MPI. Two alternations.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; lscpu | grep -E "L2|L3"; uname -r; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, program and its arguments
  local l=$1 np=$2; shift 2
  printf "%-11s np%-2s " $l $np
  timeout 40 mpirun -np $np --bind-to none "$@" -b 512K -e 4M -f 2 -n 50 -w 5 --fresh-inputs 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2; do for np in 8 16; do
  before 100 || break 2
  line dflt $np $B all_gather
  line slots $np -x FERROCCL_NODE_STAGE_MAX=1G $B all_gather
  line slots4m $np -x FERROCCL_NODE_STAGE_MAX=1G -x FERROCCL_NODE_SLOT_SIZE=4M $B all_gather
  line ompi $np /tmp/ompi_bench -C all_gather
done; done 2>&1 | tee $R/ag.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
