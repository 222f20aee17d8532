#!/usr/bin/env bash
# Round 155 (device machine's 16-core host, 2026-12-08): slots or kernel copies by trial
# (coll::stage_trial, 4ce5c30, .dev/fb-trial) against the build before it (995a46a, .dev/fb), with
# inputs reused between calls (benchmarks) and rewritten before every call (applications),
# 2, 8 and 16 ranks, all-reduce / all-gather / reduce-scatter in arrays of their own size,
# alternating: base, trial, base, trial; Open MPI in every run.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; } 2>&1 | tee $R/host.txt
for rep in 1 2; do for fresh in "" "--fresh-inputs"; do for b in fb fb-trial; do
  [ $(( $(date +%s) - T0 )) -gt 540 ] && break 3
  timeout 150 bench/compare_ompi.sh -np 2,8,16 --colls all_reduce,all_gather,reduce_scatter --sizes 32K:2M --factor 4 \
    --arrays --repeat 1 --tier 1M:20:5 $fresh --timeout 60 --no-build --ferroccl-bench $PWD/.dev/$b \
    --out $R/$b${fresh:+-fresh}-$rep > $R/log-$b${fresh:+-fresh}-$rep.txt 2>&1
  echo "[$(( $(date +%s) - T0 ))s] $b ${fresh:-reused} $rep rc=$?"
done; done; done
rm -f $R/*.png
