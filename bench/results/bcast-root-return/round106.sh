#!/usr/bin/env bash
# Round 106 (device machine, 2026-12-06): the broadcasts that go by kernel copies at 8 ranks (2
# MiB; slots up to 1 MiB) and 16 ranks (8 MiB; slots up to 4 MiB), malloc'd buffers, in a
# buffer of the message's own size (as an application's array of that size) and in a 32 MiB
# one (as nccl-tests sizes its buffers for the largest message), by the default rule and
# forced through the slots (FERROCCL_NODE_STAGE_MAX=16M); ncclMemAlloc and Open MPI alongside.
# Three alternations. Carry .dev.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench_r106 bench/ompi_bench.c || exit 1
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label np size max then mpirun args
  local l=$1 np=$2 s=$3 e=$4; shift 4
  printf "%-9s np%-2s buf %-4s " $l $np $e
  timeout 60 mpirun -np $np --bind-to none "$@" -b $s -e $e -f 4 -n 20 -w 5 2>&1 | awk -v s=$s '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed|panick/{print}'
  echo
}
for i in 1 2 3; do
  for cfg in "8 2M" "16 8M"; do set -- $cfg; np=$1; s=$2
    line default $np $s $s $B broadcast
    line slots $np $s $s -x FERROCCL_NODE_STAGE_MAX=16M $B broadcast
    line memalloc $np $s $s $B broadcast --alloc nccl
    line ompi $np $s $s /tmp/ompi_bench_r106 -C broadcast
    line default $np $s 32M $B broadcast
    line slots $np $s 32M -x FERROCCL_NODE_STAGE_MAX=16M $B broadcast
  done
done > $R/kc.txt 2>&1
cat $R/kc.txt; el done
