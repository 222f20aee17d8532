#!/usr/bin/env bash
# Round 96 (device machine, 2026-12-05 evening): the abort test's race fixed (rank 1 aborts only
# once rank 0 has looked at its stream: rank 1's abort releases rank 0's wait by design). Every
# GPU test, then gpu_processes_abort_device_send 20 times; nccl-tests -np 2 -G 5 if time is left.
# Carry .dev (build at the test fix).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
cat .dev/build.commit > $R/host.txt
timeout 150 env FERROCCL_TIMEOUT=30 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10; el "gpu tests"
fails=0
for i in $(seq 20); do
  timeout 60 .dev/it --exact cuda::gpu_processes_abort_device_send --test-threads 1 > $R/abort-$i.txt 2>&1 || { fails=$((fails+1)); echo "abort run $i failed"; }
done
echo "abort_device_send: $fails of 20 failed"; el "abort loop"
cd $OUT && tar czf r.tgz r && rm -rf r
