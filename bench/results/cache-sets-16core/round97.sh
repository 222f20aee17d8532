#!/usr/bin/env bash
# Round 97 (device machine, 2026-12-05 night), build c044bdc (library as b565738). Carry .dev.
#  1. Every GPU test, then gpu_processes_abort_device_send 20 times (its race fixed in c044bdc:
#     rank 1 aborts only after rank 0 has looked at its stream). nccl-tests built meanwhile.
#  2. nccl-tests all_reduce_perf -np 2 -G 5 -c 1 (graph capture), #wrong must be 0.
#  3. Open MPI against ferroccl at NPS ranks (default "8 2") with the harness that warms both alike
#     (05e08d2), until LIMIT s (540).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; mkdir -p $BUILD
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; } > $R/host.txt
( make -C $SRC -j4 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$R/nccl-tests-build.txt 2>&1; echo "nccl-tests build rc=$?" ) &
timeout 200 env FERROCCL_TIMEOUT=30 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10; el "gpu tests"
fails=0
for i in $(seq 20); do
  timeout 60 .dev/it --exact cuda::gpu_processes_abort_device_send --test-threads 1 > $R/abort-$i.txt 2>&1 || { fails=$((fails+1)); echo "abort run $i failed"; }
done
echo "abort_device_send: $fails of 20 failed"; el "abort loop"
wait
LD_LIBRARY_PATH=$PFX/lib timeout 120 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH $BUILD/f/all_reduce_perf -b 8 -e 64M -f 8 -G 5 -c 1 > $R/nccl-tests-G5.txt 2>&1
echo "nccl-tests -G 5 rc=$? $(grep -E 'wrong|Avg bus' $R/nccl-tests-G5.txt | tr '\n' ' ')"; el "nccl-tests"
B=$PWD/.dev/bin/ferroccl-bench
for NP in ${NPS:-8 2}; do
  left=$(( ${LIMIT:-540} - ($(date +%s) - T0) )); [ $left -lt 90 ] && break
  TMPDIR=$R/tmp timeout $left bench/compare_ompi.sh -np $NP --sizes 8:128M --factor 4 --repeat 2 --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 120 --out $R/np$NP > $R/np$NP.txt 2>&1; echo "compare np$NP rc=$?"
  grep -A16 "^## Targets" $R/np$NP.md; el "compare np$NP"
done
cd $OUT && tar czf r.tgz r && rm -rf r
