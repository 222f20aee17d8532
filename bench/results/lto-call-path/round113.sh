#!/usr/bin/env bash
# Round 113 (device machine, 2026-12-06): which rank sets the pace of a stream of 2-rank 8 B
# broadcasts on the 16-core host? ferroccl-bench-busy (round113-exp.patch, a scratch build of
# 763e563) spins EXP_BUSY_ITERS dependent steps before every call on rank EXP_BUSY_RANK only.
# If the root's extra work shows in the time per call and the receiver's does not, the root
# sets the pace (and the other way round). Open MPI's ompi_bench is not patched; it is there
# for reference.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; } 2>&1 | tee $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench-busy
mpicc -O2 -o /tmp/ompi_bench_r113 bench/ompi_bench.c || exit 1
line() {  # label, then mpirun arguments: "size us" pairs
  local l=$1; shift
  printf "%-14s " $l
  timeout 60 mpirun -np 2 --bind-to none "$@" -b 8 -e 32 -f 4 -n 50000 -w 5000 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2 3; do
  line none $B broadcast
  for k in 100 300; do
    line root-$k -x EXP_BUSY_RANK=0 -x EXP_BUSY_ITERS=$k $B broadcast
    line recv-$k -x EXP_BUSY_RANK=1 -x EXP_BUSY_ITERS=$k $B broadcast
  done
  line ompi /tmp/ompi_bench_r113 -C broadcast
done 2>&1 | tee $R/busy.txt
el done
