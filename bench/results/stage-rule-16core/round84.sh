#!/usr/bin/env bash
# Round 84 (16-core host of the GPU machine; issue 15): round 80 split in two calls (it ran past
# 440 s with both rank counts): NP=8 or NP=16, Open MPI 4.1 vs ferroccl (.dev/bin/ferroccl-bench,
# .dev/build.commit), 8 B-128 MiB, all four collectives, malloc'd and ncclMemAlloc buffers, two
# alternating repeats. Raw logs are kept under $OUT even if the call is cut short.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; } > $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
TMPDIR=$R/tmp timeout ${LIMIT:-500} bench/compare_ompi.sh -np $NP --sizes 8:128M --factor 4 --repeat 2 --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 120 --out $R/np$NP > $R/np$NP.txt 2>&1; echo "compare rc=$?"
grep -A16 "^## Targets" $R/np$NP.md; el compare
cd $OUT && tar czf r.tgz r && rm -rf r
