#!/usr/bin/env bash
# Round 133 (device machine, 2026-12-07 night). Issue 15: stage rules with fresh and reused
# inputs for the other collectives (round 132 did the all-gather at 3-16 ranks). 2 ranks:
# all-reduce, reduce-scatter, all-gather through slots up to 16 KiB (the rule) / 256K / 1M / 4M;
# 8 and 16 ranks: all-reduce and reduce-scatter, rule (128 KiB) / 1M / 4M; every line next to
# ncclMemAlloc buffers and Open MPI. Then the all-gather's new rule (1 MiB) against the old one
# (64 KiB) at 8 ranks. Two alternations where time allows.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u;
  cat /sys/kernel/mm/transparent_hugepage/enabled; } > $R/host.txt 2>&1
cat $R/host.txt
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
gcc -O2 -o /tmp/kcc bench/results/ag-stage-rule/vm/kernel_copy_cost.c && { /tmp/kcc; /tmp/kcc huge; } 2>&1 | tee $R/kernel_copy_cost.txt
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, collective, sizes, program and its arguments
  local l=$1 np=$2 c=$3 s=$4; shift 4
  printf "%-11s np%-2s %-14s " $l $np $c
  timeout 40 mpirun -np $np --bind-to none "$@" $s -n 100 -w 10 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
S2="-b 16K -e 4M -f 2"; SN="-b 64K -e 4M -f 2"
for i in 1 2; do
  for c in all_reduce reduce_scatter all_gather; do for m in fresh reused; do
    before $(( i == 1 ? 150 : 330 )) || break 2
    f=""; [ $m = fresh ] && f=--fresh-inputs
    line dflt-$m 2 $c "$S2" $B $c $f
    line s256k-$m 2 $c "$S2" -x FERROCCL_NODE_STAGE_MAX=256K $B $c $f
    line s1m-$m 2 $c "$S2" -x FERROCCL_NODE_STAGE_MAX=1M $B $c $f
    line s4m-$m 2 $c "$S2" -x FERROCCL_NODE_STAGE_MAX=4M $B $c $f
    line nccl-$m 2 $c "$S2" $B $c --alloc nccl $f
    [ $i = 1 ] && line ompi-$m 2 $c "$S2" /tmp/ompi_bench -C $c $f
  done; done 2>&1 | tee -a $R/np2.txt
  el "np2 pass $i"
  for np in 8 16; do for c in all_reduce reduce_scatter; do for m in fresh reused; do
    before $(( i == 1 ? 260 : 430 )) || break 3
    f=""; [ $m = fresh ] && f=--fresh-inputs
    line dflt-$m $np $c "$SN" $B $c $f
    line s1m-$m $np $c "$SN" -x FERROCCL_NODE_STAGE_MAX=1M $B $c $f
    line s4m-$m $np $c "$SN" -x FERROCCL_NODE_STAGE_MAX=4M $B $c $f
    line nccl-$m $np $c "$SN" $B $c --alloc nccl $f
    [ $i = 1 ] && line ompi-$m $np $c "$SN" /tmp/ompi_bench -C $c $f
  done; done; done 2>&1 | tee -a $R/np8-16.txt
  el "np8/16 pass $i"
  [ $i = 1 ] && for m in fresh reused; do
    f=""; [ $m = fresh ] && f=--fresh-inputs
    line new-$m 8 all_gather "-b 32K -e 4M -f 2" $B all_gather $f
    line old64k-$m 8 all_gather "-b 32K -e 4M -f 2" -x FERROCCL_NODE_STAGE_MAX=64K $B all_gather $f
  done 2>&1 | tee -a $R/ag8.txt
done
el "end"
cd $OUT && tar czf r.tgz r && rm -rf r
