#!/usr/bin/env bash
# Round 81 (one H200), READY for the next session with a GPU: the build after the graph-capture
# refusal and ncclGroupSimulateEnd. Every GPU test (incl. simulate_end_with_device_buffers_runs_nothing),
# then nccl-tests all_reduce -np 2 processes with -G 5 (#wrong 0). Carry .dev (prefix, it, nccl-tests source). Then, if device time is left,
# bench/results/malloc-allreduce-16core-2026-12-04/round80.sh in a call of its own.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export FERROCCL_TIMEOUT=30
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
cat .dev/build.commit
timeout 240 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10; el "gpu tests"
PFX=$PWD/.dev/prefix; B=/tmp/b; GEN="-gencode=arch=compute_90,code=sm_90"
make -C .dev/nccl-tests -j15 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$B/f > $R/nccl-tests-build.txt 2>&1
echo "nccl-tests build rc=$?"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
wrong() { awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $1 | sort -u | tr '\n' ' '; }
# No -t 2 runs: nccl-tests 2.19.6 gives thread i device NCCL_TESTS_DEVICE + i, so two threads
# need two GPUs (round 83: "Invalid number of GPUs: 2 requested but only 1"); rank threads sharing
# one GPU, and the refusal of their captures, are covered by the GPU tests above.
timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib -x FERROCCL_TIMEOUT $B/f/all_reduce_perf -b 8 -e 64M -f 8 -c 1 -n 5 -w 2 -G 5 > $R/np2-G.log 2>&1
echo "-np 2 -G 5 rc=$? wrong: $(wrong $R/np2-G.log)"
el "nccl-tests"
cd $OUT && tar czf r.tgz r && rm -rf r
