#!/usr/bin/env bash
# Round 109 (device machine, 2026-12-06): broadcast roots at 3-8 ranks take the slots for 1-4
# MiB unless their buffer is on huge pages. 8 ranks, 2 and 4 MiB in an array of the message's
# size and in a 32 MiB buffer, this build against the one before (.dev/bin/ferroccl-bench-old,
# 92068f2) and Open MPI, three alternations; then ferroccl against Open MPI, broadcast, 8
# ranks, both buffer kinds, three repeats. Carry .dev.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench_r109 bench/ompi_bench.c || exit 1
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label np size max then mpirun args
  local l=$1 np=$2 s=$3 e=$4; shift 4
  printf "%-5s np%-2s buf %-4s " $l $np $e
  timeout 60 mpirun -np $np --bind-to none "$@" -b $s -e $e -f 2 -n 20 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed|panick/{print}'
  echo
}
for i in 1 2 3; do
  for e in 2M 4M 32M; do
    line old 8 2M $e $B-old broadcast
    line new 8 2M $e $B broadcast
    [ $e != 32M ] && line ompi 8 2M $e /tmp/ompi_bench_r109 -C broadcast
  done
done > $R/hp.txt 2>&1
cat $R/hp.txt; el hp
TMPDIR=$R/tmp timeout 400 bench/compare_ompi.sh -np 8 --colls broadcast --sizes 8:128M --factor 4 --repeat 3 --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 300 --out $R/np8 > $R/np8.txt 2>&1
el "compare rc=$?"
sed -n '/^| size/,/^$/p' $R/np8.md 2>/dev/null; grep -E "PASS|MISS" $R/np8.md
rm -rf $R/np8-logs $R/tmp; el done
