#!/usr/bin/env bash
# Round 26: the cuda:: suite on 91b60c3 (6e5420a and 3a89390 had not run on the GPU), three runs.
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/.dev/prefix/lib
for i in 1 2 3; do
  timeout 90 .dev/it cuda:: --test-threads 1 > $OUT/it-cuda-$i.txt 2>&1; echo "run $i rc=$? [$(( $(date +%s) - T0 ))s]"
  grep -E "test result|FAILED|panicked" $OUT/it-cuda-$i.txt | head -5
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
