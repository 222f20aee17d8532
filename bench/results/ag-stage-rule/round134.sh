#!/usr/bin/env bash
# Round 134 (device machine, 2026-12-07). Issue 15: the new stage rules of 88b8acc against the
# old ones, set through FERROCCL_NODE_STAGE_MAX, fresh and reused inputs, with Open MPI:
# 2 ranks all-reduce / reduce-scatter / all-gather (old 16 KiB, new 512 KiB), 4 ranks
# reduce-scatter (old 128 KiB, new 512 KiB) and all-gather (old 64 KiB, new 1 MiB), 8 and 16
# ranks reduce-scatter (old 128 KiB, new 512 KiB). Two alternations.
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
  printf "%-11s np%-2s %-14s " $l $np $c
  timeout 40 mpirun -np $np --bind-to none "$@" $s -n 100 -w 10 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
cmp() { # np, collective, sizes, old stage max, pass
  local np=$1 c=$2 s=$3 old=$4 i=$5
  for m in fresh reused; do
    f=""; [ $m = fresh ] && f=--fresh-inputs
    line new-$m $np $c "$s" $B $c $f
    line old-$m $np $c "$s" -x FERROCCL_NODE_STAGE_MAX=$old $B $c $f
    [ $i = 1 ] && line ompi-$m $np $c "$s" /tmp/ompi_bench -C $c $f
  done
}
for i in 1 2; do
  [ $i = 2 ] && ! before 110 && break
  for c in all_reduce reduce_scatter all_gather; do before 200 || break; cmp 2 $c "-b 8K -e 2M -f 2" 16K $i; done
  before 220 && cmp 4 reduce_scatter "-b 32K -e 2M -f 2" 128K $i
  before 240 && cmp 4 all_gather "-b 32K -e 2M -f 2" 64K $i
  before 260 && cmp 8 reduce_scatter "-b 64K -e 2M -f 2" 128K $i
  before 280 && cmp 16 reduce_scatter "-b 64K -e 2M -f 2" 128K $i
  el "pass $i"
done 2>&1 | tee $R/confirm.txt
cd $OUT && tar czf r.tgz r && rm -rf r
