#!/usr/bin/env bash
# Round 123 (device machine, 2026-12-06): issue 15's 2-rank broadcast of 8-32 B. A rank's tiny
# slot store needs the line back from the peer that read it (a read-for-ownership), and the
# locked instructions after it in the call (the links mutex's unlock, the Arc's drop) wait for
# that store to leave the store buffer. Scratch build (round123-exp.patch): after posting slot
# seq, prefetchw the slot line of seq + 8, which no peer polls yet, so that the store 8 calls
# later finds its line owned. ferroccl-bench (74e5e4b) against ferroccl-bench-pf and Open MPI,
# alternating four times at 2 ranks, twice at 8.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; grep -m1 -o 'prfchw\|3dnowprefetch' /proc/cpuinfo; uname -r; uptime; date -u; } 2>&1 | tee $R/host.txt
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || exit 1
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, collective, program and its arguments
  local l=$1 np=$2 c=$3; shift 3
  printf "%-5s np%-2s %-10s " $l $np $c
  timeout 60 mpirun -np $np --bind-to none "$@" -b 8 -e 512 -f 4 -n 100000 -w 1000 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2 3 4; do for c in broadcast all_reduce; do
  line base 2 $c $B $c
  line pf 2 $c $B-pf $c
  line ompi 2 $c /tmp/ompi_bench -C $c
done; done 2>&1 | tee $R/np2.txt
el np2
for i in 1 2; do for c in broadcast all_reduce; do
  line base 8 $c $B $c
  line pf 8 $c $B-pf $c
  line ompi 8 $c /tmp/ompi_bench -C $c
done; done 2>&1 | tee $R/np8.txt
el done
