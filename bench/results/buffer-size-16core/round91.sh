#!/usr/bin/env bash
# Round 91 (device machine, build in .dev = d23f369 with warm_inputs): round 81's GPU checks,
# then the 16-rank comparison with Open MPI (all four collectives, malloc'd and ncclMemAlloc
# buffers, 2 repeats; compare_ompi.sh now sweeps both programs once, in the same buffers).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p $OUT/g; OUT=$OUT/g bash bench/results/gpu-thread-p2p/round81.sh > $OUT/round81.txt 2>&1
cat $OUT/round81.txt; el "round 81"
NP=16 LIMIT=330 bash bench/results/stage-rule-16core/round84.sh; el "np16"
