#!/usr/bin/env bash
# 2 ranks on the 2-core VM: the stage rule (slots up to 16 KiB) against 256K/1M/4M, fresh and
# reused inputs, next to ncclMemAlloc buffers and Open MPI; three alternations.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${B:-$PWD/.dev/bin/ferroccl-bench}
line() {
  local l=$1 c=$2; shift 2
  printf "%-11s %-14s " $l $c
  mpirun -np 2 --bind-to core "$@" -b 16K -e 4M -f 2 -n 100 -w 10 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
lscpu | grep "Model name"; cat .dev/build.commit; date -u
for i in 1 2 3; do for c in ${COLLS:-all_reduce reduce_scatter all_gather}; do for m in fresh reused; do
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $c $B $c $f
  line s256k-$m $c -x FERROCCL_NODE_STAGE_MAX=256K $B $c $f
  line s1m-$m $c -x FERROCCL_NODE_STAGE_MAX=1M $B $c $f
  line s4m-$m $c -x FERROCCL_NODE_STAGE_MAX=4M $B $c $f
  line nccl-$m $c $B $c --alloc nccl $f
  line ompi-$m $c /tmp/ompi_bench -C $c $f
done; done; grep -E "^(cpu|steal)" /proc/stat | head -1; done
