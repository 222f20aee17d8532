#!/usr/bin/env bash
# Round 92 (16-core host, build in .dev = d23f369): the comparison with Open MPI at 8 and then 2
# ranks, all four collectives, malloc'd and ncclMemAlloc buffers, 2 repeats, one sweep per
# program in the same buffers (compare_ompi.sh at c61387e). Whatever finishes comes back.
set -u
for NP in 8 2; do
  mkdir -p $OUT/np$NP
  OUT=$OUT/np$NP NP=$NP LIMIT=150 bash bench/results/stage-rule-16core/round84.sh
done
