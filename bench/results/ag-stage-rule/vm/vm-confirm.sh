#!/usr/bin/env bash
# 2 ranks on the 2-core VM: 88b8acc's stage rule (slots up to 512 KiB) against the old one (16
# KiB, via FERROCCL_NODE_STAGE_MAX), fresh and reused inputs, Open MPI; three alternations.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${B:-$PWD/.dev/bin/ferroccl-bench}
line() {
  local l=$1 c=$2; shift 2
  printf "%-11s %-14s " $l $c
  mpirun -np 2 --bind-to core "$@" -b 8K -e 4M -f 2 -n 100 -w 10 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
lscpu | grep "Model name"; cat .dev/build.commit; date -u
for i in 1 2 3; do for c in all_reduce reduce_scatter all_gather; do for m in fresh reused; do
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line new-$m $c $B $c $f
  line old-$m $c -x FERROCCL_NODE_STAGE_MAX=16K $B $c $f
  line ompi-$m $c /tmp/ompi_bench -C $c $f
done; done; grep -E "^cpu " /proc/stat; done
