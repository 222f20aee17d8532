#!/usr/bin/env bash
# Round 82 (one H200 machine, 16 cores), the build in .dev (carry it; .dev/build.commit names it): round 81's GPU checks
# (every GPU test, incl. simulate_end_with_device_buffers_runs_nothing; nccl-tests -t 2 plain,
# -t 2 -G 5 (a quick clean ncclInvalidUsage), -np 2 -G 5), then issue 15 on 16 cores: slots
# (FERROCCL_NODE_STAGE_MAX=1T) against kernel copies (0) with malloc'd buffers on huge pages,
# 2, 8 and 16 ranks, all four collectives, 2 alternating repeats (the 16-core rules of
# node::default_stage_max were measured before huge pages).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p $OUT/g; OUT=$OUT/g bash bench/results/gpu-thread-p2p/round81.sh > $OUT/g/round81.txt 2>&1
cat $OUT/g/round81.txt
el "round 81"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; } > $R/host.txt
for NP in 2 8 16; do
  NP=$NP REPS=2 FB=.dev/bin/ferroccl-bench bash bench/results/stage-crossover-2core-2026-12-05/ab_stage.sh
  el "np $NP"
done > $R/ab-16core.txt 2>&1
cat $R/ab-16core.txt | grep "^\[" ; el done
cd $OUT && tar czf r.tgz r && rm -rf r
