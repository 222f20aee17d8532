#!/usr/bin/env bash
# Round 83 (one GPU machine, 16 cores), the build in .dev (carry it; .dev/build.commit names it):
# round 81's GPU checks (every GPU test; nccl-tests -t 2 plain, -t 2 -G 5, -np 2 -G 5, all with
# NCCL_TESTS_DEVICE=0), then issue 15: the before/after A/B of 9f4180b's stage rule
# (ab_rule.sh, 3 alternating repeats). Then round80.sh in a call of its own.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; } > $R/host.txt 2>&1
cat $R/host.txt
mkdir -p $OUT/g; OUT=$OUT/g bash bench/results/gpu-thread-p2p/round81.sh > $R/round81.txt 2>&1
cat $R/round81.txt; (cd $OUT/g && tar xzf r.tgz && cp -r r/* $R/ && rm -rf $OUT/g)
el "round 81"
REPS=3 FB=.dev/bin/ferroccl-bench bash bench/results/stage-rule-16core/ab_rule.sh > $R/ab-rule.txt 2>&1
cat $R/ab-rule.txt | cut -c1-60; el done
cd $OUT && tar czf r.tgz r && rm -rf r
