#!/usr/bin/env bash
# 2 ranks on the 2-core VM, 4-64 MiB: the stage rule (kernel copies from 16 KiB) against slots
# at every size (FERROCCL_NODE_STAGE_MAX=1G), fresh and reused inputs, Open MPI; three alternations.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${B:-$PWD/.dev/bin/ferroccl-bench}
line() {
  local l=$1 c=$2; shift 2
  printf "%-11s %-14s " $l $c
  mpirun -np 2 --bind-to core "$@" -b 4M -e 64M -f 2 -n 20 -w 3 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
lscpu | grep "Model name"; cat .dev/build.commit; date -u
for i in 1 2 3; do for c in ${COLLS:-all_reduce reduce_scatter all_gather}; do for m in fresh reused; do
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $c $B $c $f
  line sall-$m $c -x FERROCCL_NODE_STAGE_MAX=1G $B $c $f
  [ $i = 1 ] && line ompi-$m $c /tmp/ompi_bench -C $c $f
done; done; grep -E "^cpu " /proc/stat; done
