#!/usr/bin/env bash
# Round 95 (16-core host of the device machine, 2026-12-05 evening), build 05e08d2 (library as d35352b: data slot
# skew; compare_ompi.sh warming both programs alike). Carry .dev.
#  1. GPU tests; gpu_processes_abort_device_send 12 more times with P2P tracing (round 94: 4 of
#     12 failed: rank 0's held send finished while rank 1's stream was held); the test now
#     reports the async and last errors when that happens.
#  2. Open MPI against ferroccl at NPS ranks (default 16; round 84's command) until LIMIT s (330).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; } > $R/host.txt
timeout 200 env FERROCCL_TIMEOUT=30 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10; el "gpu tests"
fails=0
for i in $(seq 12); do
  NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=P2P timeout 60 .dev/it --exact cuda::gpu_processes_abort_device_send --test-threads 1 > $R/abort-$i.txt 2>&1 || { fails=$((fails+1)); echo "abort run $i failed"; }
done
echo "abort_device_send: $fails of 12 failed"; grep -h "held send or receive finished" $R/abort-*.txt | head -3; el "abort loop"
B=$PWD/.dev/bin/ferroccl-bench
for NP in ${NPS:-16}; do
  left=$(( ${LIMIT:-330} - ($(date +%s) - T0) )); [ $left -lt 90 ] && break
  TMPDIR=$R/tmp timeout $left bench/compare_ompi.sh -np $NP --sizes 8:128M --factor 4 --repeat 2 --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 120 --out $R/np$NP > $R/np$NP.txt 2>&1; echo "compare np$NP rc=$?"
  grep -A16 "^## Targets" $R/np$NP.md; el "compare np$NP"
done
cd $OUT && tar czf r.tgz r && rm -rf r
