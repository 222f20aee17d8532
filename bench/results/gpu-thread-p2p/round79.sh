#!/usr/bin/env bash
# Round 79 (one H200): round 78 (the graph test's stop diagnosed, old and new binaries, every GPU
# test) then round 75 (issue 14: FERROCCL_STAGE_PIECE sweep, every GPU test again). Results in
# $OUT/r78.tgz and $OUT/r75.tgz.
bash bench/results/gpu-thread-p2p/round78.sh; mv $OUT/r.tgz $OUT/r78.tgz
bash bench/results/gpu-staged-pieces/round75.sh; mv $OUT/r.tgz $OUT/r75.tgz
