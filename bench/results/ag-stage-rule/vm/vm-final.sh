#!/usr/bin/env bash
# 2 ranks on the 2-core VM at the final rules (a9fcbf7, binary in $B), fresh and reused inputs,
# against Open MPI, 8 B-4 MiB, three alternations.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
line() {
  local l=$1 c=$2; shift 2
  printf "%-11s %-14s " $l $c
  mpirun -np 2 --bind-to core "$@" -b 8 -e 4M -f 4 -n 100 -w 10 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
lscpu | grep "Model name"; date -u
for i in 1 2 3; do for c in all_reduce reduce_scatter all_gather; do for m in fresh reused; do
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line ferro-$m $c $B $c $f
  line ompi-$m $c /tmp/ompi_bench -C $c $f
done; done; grep -E "^cpu " /proc/stat; done
