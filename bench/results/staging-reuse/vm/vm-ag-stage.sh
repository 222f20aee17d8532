#!/usr/bin/env bash
# 2-core AMD VM, 2 ranks: the all-gather and all-reduce stage rules (2 ranks: 16 KiB, larger by
# kernel copies) with fresh and with reused malloc'd inputs, FERROCCL_NODE_STAGE_MAX unset /
# 1M, next to ncclMemAlloc buffers; three alternations.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${B:-target/release/ferroccl-bench}
line() { local l=$1 c=$2; shift 2
  printf "%-12s %-10s " $l $c
  timeout 120 mpirun -np 2 --bind-to none "$@" -b 32K -e 4M -f 4 -n 200 -w 20 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
{ git rev-parse --short HEAD; nproc; grep -m1 'model name' /proc/cpuinfo; date -u; } 
for i in 1 2 3; do for c in all_gather all_reduce; do
  line dflt-fresh $c $B $c --fresh-inputs
  line s1m-fresh $c -x FERROCCL_NODE_STAGE_MAX=1M $B $c --fresh-inputs
  line nccl-fresh $c $B $c --alloc nccl --fresh-inputs
  line dflt-reused $c $B $c
  line s1m-reused $c -x FERROCCL_NODE_STAGE_MAX=1M $B $c
  line nccl-reused $c $B $c --alloc nccl
done; done
