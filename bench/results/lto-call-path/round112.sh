#!/usr/bin/env bash
# Round 112 (device machine, 2026-12-06): a receiver of a tiny broadcast reads the root's
# signature from the tiny slot's own line instead of the root's Arrived line (whose 128-byte
# pair holds the root's Left counter, written every operation). Carry .dev: ferroccl-bench =
# 763e563 (LTO), ferroccl-bench-tiny = the change on top.
#  Broadcast 8-512 B, malloc'd buffers, alternating lto / tiny / Open MPI five times at 2 ranks
#  and three times at 8 and 16; all-reduce 8-512 B at 2 ranks, three times.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ nproc; grep -m1 'model name' /proc/cpuinfo; lscpu | grep -E "Thread|Core|Socket|L2|L3"; nvidia-smi -L; uptime; date -u; } 2>&1 | tee $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
mpicc -O2 -o /tmp/ompi_bench_r112 bench/ompi_bench.c || exit 1
line() {  # label, np, iterations, then the program and its arguments: "size us" pairs
  local l=$1 np=$2 n=$3; shift 3
  printf "%-5s np%-2s " $l $np
  timeout 90 mpirun -np $np --bind-to none "$@" -b 8 -e 512 -f 4 -n $n -w $((n / 10 + 5)) 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for np in 2 8 16; do
  n=50000; reps=5; [ $np -gt 2 ] && { n=10000; reps=3; }
  for i in $(seq $reps); do
    line lto $np $n $B broadcast
    line tiny $np $n $B-tiny broadcast
    line ompi $np $n /tmp/ompi_bench_r112 -C broadcast
  done
done 2>&1 | tee $R/bcast.txt
el bcast
for i in 1 2 3; do
  line lto 2 50000 $B all_reduce
  line tiny 2 50000 $B-tiny all_reduce
  line ompi 2 50000 /tmp/ompi_bench_r112 -C all_reduce
done 2>&1 | tee $R/ar.txt
el done
