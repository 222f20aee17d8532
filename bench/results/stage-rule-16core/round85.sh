#!/usr/bin/env bash
# Round 85 (16-core host of the GPU machine; issue 15), the build in .dev (carry it): the revised
# stage rule's before/after A/B in small (8K-512K: 4 KiB pages) and large (2M-32M: huge pages)
# buffers for the broadcast at 8 and 16 ranks, 2 alternating repeats, then round 84 at 16 ranks (Open MPI side by side).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; } > $R/host.txt
CELLS="broadcast:8:1T broadcast:16:1T" SEGS="8K:512K 2M:32M" REPS=2 \
  FB=.dev/bin/ferroccl-bench bash bench/results/stage-rule-16core/ab_rule.sh > $R/ab-rule2.txt 2>&1
el "ab"; mkdir -p $OUT/c
OUT=$OUT/c NP=16 LIMIT=${LIMIT:-400} bash bench/results/stage-rule-16core/round84.sh
(cd $OUT/c && tar xzf r.tgz && cp -r r/* $R/ && cd $OUT && rm -rf $OUT/c); el done
cd $OUT && tar czf r.tgz r && rm -rf r
