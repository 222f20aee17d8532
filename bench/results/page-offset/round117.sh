#!/usr/bin/env bash
# Round 117 (device machine, 2026-12-06): the other collectives at 2 ranks against Open MPI on
# the 16-core host after the LTO build (.dev/bin/ferroccl-bench = 17530b7; at 2 ranks the same
# as the session's final code).
#   bench/compare_ompi.sh -np 2 --colls all_gather,broadcast,reduce_scatter --sizes 8:128M --factor 4 --repeat 2
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; } 2>&1 | tee $R/host.txt
timeout 500 bench/compare_ompi.sh -np 2 --colls all_gather,broadcast,reduce_scatter --sizes 8:128M --factor 4 --repeat 2 \
  --no-build --ferroccl-bench $PWD/.dev/bin/ferroccl-bench --out $R/np2 > $R/compare.log 2>&1
echo "compare rc=$? after $(( $(date +%s) - T0 ))s"
sed -n '/## Targets/,/## Small/p' $R/np2.md
