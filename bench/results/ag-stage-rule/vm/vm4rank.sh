#!/usr/bin/env bash
# 4 ranks on the 2-core VM (oversubscribed: slots up to 128 KiB for all-reduce, all-gather and
# reduce-scatter) against slots to 512 KiB and 2 MiB, fresh and reused inputs, Open MPI; three
# alternations.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
line() {
  local l=$1 c=$2; shift 2
  printf "%-11s %-14s " $l $c
  mpirun -np 4 "$@" -b 32K -e 4M -f 2 -n 50 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
lscpu | grep "Model name"; date -u
for i in 1 2 3; do for c in all_reduce reduce_scatter all_gather; do for m in fresh reused; do
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $c $B $c $f
  line s512k-$m $c -x FERROCCL_NODE_STAGE_MAX=512K $B $c $f
  line s2m-$m $c -x FERROCCL_NODE_STAGE_MAX=2M $B $c $f
  [ $i = 1 ] && line ompi-$m $c /tmp/ompi_bench -C $c $f
done; done; grep -E "^cpu " /proc/stat; done
