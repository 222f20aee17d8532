#!/usr/bin/env bash
# 2-core AMD VM, 2 ranks: the all-reduce stage rule (16 KiB) against slots up to 1 MiB, with the
# benchmark's buffers sized for 32 MiB (as stage-crossover-2core-2026-12-05 measured), reused
# and fresh inputs, two alternations.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${B:-target/release/ferroccl-bench}
line() { local l=$1 c=$2; shift 2
  printf "%-12s %-10s " $l $c
  timeout 120 mpirun -np 2 --bind-to none "$@" -b 32K -e 32M -f 4 -n 100 -w 10 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
{ git rev-parse --short HEAD; nproc; grep -m1 'model name' /proc/cpuinfo; date -u; }
for i in 1 2; do c=all_reduce
  line dflt-reused $c $B $c
  line s1m-reused $c -x FERROCCL_NODE_STAGE_MAX=1M $B $c
  line dflt-fresh $c $B $c --fresh-inputs
  line s1m-fresh $c -x FERROCCL_NODE_STAGE_MAX=1M $B $c --fresh-inputs
done
