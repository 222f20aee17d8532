#!/usr/bin/env bash
# Diagnose cuda::device_scalar_and_graph_threads_1_2_3 (stopped in rounds 19/20): run it alone with
# NCCL_DEBUG=INFO, and if it is still running after 45 s take every thread's stack.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LD_LIBRARY_PATH=$PWD/.dev/prefix/lib
which gdb eu-stack 2>&1 | head
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2 3; do
  NCCL_DEBUG=INFO RUST_BACKTRACE=1 .dev/it cuda::device_scalar --test-threads 1 --nocapture > $R/ds-$i.txt 2>&1 &
  P=$!
  for t in $(seq 1 45); do sleep 1; kill -0 $P 2>/dev/null || break; done
  if kill -0 $P 2>/dev/null; then
    el "run $i still running after 45 s: stacks"
    for task in /proc/$P/task/*; do echo "$(basename $task) $(cat $task/comm) wchan=$(cat $task/wchan)"; done > $R/tasks-$i.txt
    if command -v gdb >/dev/null; then timeout 60 gdb -p $P -batch -ex "thread apply all bt 30" > $R/gdb-$i.txt 2>&1; fi
    if command -v eu-stack >/dev/null; then timeout 30 eu-stack -p $P > $R/eu-$i.txt 2>&1; fi
    kill -9 $P
  fi
  wait $P; echo "run $i rc=$?"; grep -E "^test |test result|panicked" $R/ds-$i.txt
done
el "device_scalar"
( timeout 200 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "^test |test result" $R/it-cuda.txt
el "all cuda"
