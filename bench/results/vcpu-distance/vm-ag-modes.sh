#!/usr/bin/env bash
# AMD 2-core VM, 2026-12-07: 2-rank all-gather of a 256 KiB array (-b 256K -e 256K, reused
# inputs, -c 0), three cycles a launch, through the slots (the default at this size), by
# ncclMemAlloc buffers read in place, and by kernel copies (FERROCCL_NODE_STAGE_MAX=0),
# alternated; the two vCPUs' cache-line round trip (pingpair 0 1, 0.3 s) before and after.
# Usage: vm-ag-modes.sh FERROCCL_BENCH PINGPAIR ROUNDS
set -u
B=$1 P=$2 N=${3:-8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for i in $(seq 1 $N); do for mode in slots mem kc; do
  case $mode in slots) X=""; A="";; mem) X=""; A="--alloc nccl";; kc) X="-x FERROCCL_NODE_STAGE_MAX=0"; A="";; esac
  a=$($P 0 1 0.3)
  r=$(timeout 60 mpirun -np 2 --bind-to none $X $B all_gather -b 256K -e 256K -n 1000 -w 10 -N 3 -c 0 $A 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s ", $6}')
  b=$($P 0 1 0.3)
  echo "$i $mode pp-before ${a}ns us: $r pp-after ${b}ns"
done; done
