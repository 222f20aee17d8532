#!/usr/bin/env bash
# Round 142 (device machine, 16-core host; 2026-12-07): the all-reduce's gathered kernel-copy
# inputs at 3-6 ranks, where (n - 1) x piece <= 1 MiB holds at every size (pieces stop at 256
# KiB) but rounds 139-141 measured only 8 and 16 ranks. `gath` is 6a3f828 (gathers at 3+
# ranks), `fold` the same tree with da7cbeb's coll/node.rs (reads in fold order); malloc'd,
# fresh and reused inputs, order alternated, Open MPI once.
# Build: .dev/bin/ferroccl-bench from 6a3f828, .dev/bin/ferroccl-bench-fold with da7cbeb's
# src/coll/node.rs; carry [".dev/bin", ".dev/build.commit"].
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
G=$PWD/.dev/bin/ferroccl-bench F=$PWD/.dev/bin/ferroccl-bench-fold
line() {  # label, np, coll, sizes, program and its arguments
  local l=$1 np=$2 c=$3 sz=$4; shift 4
  printf "%-14s np%-2s %s " $l $np $c
  timeout 40 mpirun -np $np --bind-to none "$@" $sz -f 2 -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed|panick/{print}'
  echo
}
el "all-reduce at 3-6 ranks"
for i in 1 2 3; do for np in 3 4 5 6; do for m in fresh reused; do
  before 130 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  sz="-b 256K -e 16M"
  if [ $((i % 2)) = 1 ]; then line fold-$m $np all_reduce "$sz" $F all_reduce $f; line gath-$m $np all_reduce "$sz" $G all_reduce $f
  else line gath-$m $np all_reduce "$sz" $G all_reduce $f; line fold-$m $np all_reduce "$sz" $F all_reduce $f; fi
  [ $i = 1 ] && line ompi-$m $np all_reduce "$sz" /tmp/ompi_bench -C all_reduce $f
done; done; done 2>&1 | tee $R/ar.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
