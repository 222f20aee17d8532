#!/usr/bin/env bash
# Round 80 (16-core host of the H200 machine; issue 15): round 73 without its huge-page A/B, to fit
# one call of at most 600 s: Open MPI 4.1 vs ferroccl on a quiet host, 8 and 16 ranks, 8 B-128 MiB,
# all four collectives, malloc'd and ncclMemAlloc buffers, two alternating repeats.
# .dev/bin/ferroccl-bench built at 474e0ac (the host path has not changed since).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
B=$PWD/.dev/bin/ferroccl-bench
timeout 440 bench/compare_ompi.sh -np 8,16 --sizes 8:128M --factor 4 --repeat 2 --both-allocs --no-build --ferroccl-bench $B --timeout 120 --out $R/np8-16 > $R/np8-16.txt 2>&1; echo "compare rc=$?"
grep -A16 "^## Targets" $R/np8-16.md; el compare
cd $OUT && tar czf r.tgz r && rm -rf r
