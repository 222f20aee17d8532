#!/usr/bin/env bash
# Round 116 (device machine, 2026-12-06): all-reduce against Open MPI at 2, 8 and 16 ranks on
# the 16-core host with the session's final library code (17530b7: fat LTO, page-matched
# staging, streaming from 32 MiB). Carry .dev (.dev/bin/ferroccl-bench = 17530b7).
#  1. bench/compare_ompi.sh -np 2,8,16 --colls all_reduce --sizes 8:128M --factor 4 --repeat 2
#  2. 2 ranks, 16 MiB (between the harness's sizes), ferroccl / Open MPI alternating three times.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; } 2>&1 | tee $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
timeout 420 bench/compare_ompi.sh -np 2,8,16 --colls all_reduce --sizes 8:128M --factor 4 --repeat 2 --no-build \
  --ferroccl-bench $B --out $R/ar > $R/compare.log 2>&1; el "compare rc=$?"
sed -n '/## Targets/,/## Small/p' $R/ar.md
mpicc -O2 -o /tmp/ompi_bench_r116 bench/ompi_bench.c || exit 1
for i in 1 2 3; do
  printf "ferroccl "; timeout 60 mpirun -np 2 --bind-to none $B all_reduce -b 16M -e 16M -n 10 -w 3 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s\n", $1, $6}'
  printf "ompi     "; timeout 60 mpirun -np 2 --bind-to none /tmp/ompi_bench_r116 -C all_reduce -b 16M -e 16M -n 10 -w 3 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s\n", $1, $6}'
done 2>&1 | tee $R/ar16m.txt
el done
