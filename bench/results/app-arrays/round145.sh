#!/usr/bin/env bash
# Round 145 (device machine, 16-core host; 2026-12-07): the 16-rank all-gather launches that ran
# 5-10x slow at 128-512 KiB in rounds 143-144 (either staging rule). Eight launches each of a
# 256 KiB array with ranks unbound (--bind-to none, as before) and bound to cores
# (--bind-to core), alternated, Open MPI likewise, all-gather 256 KiB, -n 100 -w 10. If only
# unbound launches stall, the scheduler's placement of polling ranks is the cause.
# Build and carry as round143.sh.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/fb-base
line() { local l=$1 bind=$2; shift 2
  printf "%-10s np16 all_gather 256K " $l
  timeout 40 mpirun -np 16 --bind-to $bind "$@" -b 256K -e 256K -n 100 -w 10 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s %s", $6, $10} /[Ee]rror|failed|panick/{print}'
  echo
}
for i in 1 2 3 4 5 6 7 8; do
  before 300 || break
  line def-none none $B all_gather; line def-core core $B all_gather
  line ompi-none none /tmp/ompi_bench -C all_gather; line ompi-core core /tmp/ompi_bench -C all_gather
done 2>&1 | tee $R/ag16.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
