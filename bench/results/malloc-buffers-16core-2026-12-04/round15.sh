#!/usr/bin/env bash
# Round 15 (issue 15): compare_ompi.sh at 2, 4, 8, 16 ranks, malloc'd buffers then ncclMemAlloc buffers.
set -u
R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_SOCKET_IFNAME=lo GIT_COMMIT=$(cat .dev/commit)
B=$PWD/.dev/bin/ferroccl-bench-new
for mode in hostalloc memalloc; do
  extra=(); [ $mode = hostalloc ] && extra=(--host-alloc)
  s=$SECONDS
  timeout 285 bash bench/compare_ompi.sh -np 2,4,8,16 --sizes 8:128M --factor 4 "${extra[@]}" --ferroccl-bench $B --no-build --out $R/ompi-compare-16core-2026-12-04-$mode > $R/cmp-$mode.log 2>&1
  echo "compare $mode rc=$? $((SECONDS-s)) s"
  grep -A24 "## Targets" $R/ompi-compare-16core-2026-12-04-$mode.md | grep -E "MISS|PASS"
done
cd $OUT && tar czf r.tgz r && rm -rf r
