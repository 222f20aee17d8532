#!/usr/bin/env bash
# Round 76 (the H200 machine; issue 18), READY for a session with a GPU: device sends and
# receives between rank threads of one process, written without a GPU (d9fef3d..: by address;
# threads on one GPU only with FERROCCL_PEER_PATH_ON_ONE_GPU=1, taking turns through
# local_order; staged otherwise). First the thread tests alone with the P2P log (the peer-path
# test runs its children with the switch: "P2P/direct" lines expected there only), then on one
# hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, where a wait queued before its write stops
# for good), nccl-tests with -R 1 and -R 2 (window registration), then every GPU test. Carry
# .dev (prefix, .dev/it the GPU test binary of one build, .dev/nccl-tests the source).
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export FERROCCL_TIMEOUT=30
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
cat .dev/build.commit
for t in device_p2p_threads_2_and_3 one_thread_drives_every_rank_with_messages one_thread_drives_every_rank_on_the_peer_path; do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=P2P timeout 120 .dev/it --exact cuda::$t --nocapture --test-threads 1 > $R/$t.txt 2>&1
  echo "$t rc=$? $(grep -E 'test result' $R/$t.txt) direct-lines=$(grep -c 'P2P/direct' $R/$t.txt) staged-lines=$(grep -ci 'staged' $R/$t.txt)"
  grep -E "panicked|FAILED" -A3 $R/$t.txt | head -8
done
el "thread p2p"
timeout 150 .dev/it --exact cuda::rank_threads_with_one_hardware_queue --nocapture --test-threads 1 > $R/one-queue.txt 2>&1
echo "one hardware queue rc=$? $(grep -E 'test result' $R/one-queue.txt)"; grep -E "panicked" -A6 $R/one-queue.txt | head -10
el "one queue"
# nccl-tests with registered buffers (-R 1: ncclCommRegister) and windows (-R 2:
# ncclCommWindowRegister, bookkeeping since this build), 1 and 2 ranks on the GPU.
PFX=$PWD/.dev/prefix; B=/tmp/b; GEN="-gencode=arch=compute_90,code=sm_90"
make -C .dev/nccl-tests -j15 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$B/f > $R/nccl-tests-build.txt 2>&1
echo "nccl-tests build rc=$?"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for np in 1 2; do for reg in 1 2; do for c in all_reduce all_gather; do
  timeout 60 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib -x FERROCCL_TIMEOUT \
    $B/f/${c}_perf -b 8 -e 64M -f 8 -c 1 -n 5 -w 2 -R $reg > $R/R$reg-$c-np$np.log 2>&1
  echo "-R $reg $c np $np rc=$? wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/R$reg-$c-np$np.log | sort -u | tr '\n' ' ')$(grep -E 'Out of bounds' $R/R$reg-$c-np$np.log | awk '{print $(NF-1), $NF}')"
done; done; done
el "nccl-tests -R"
timeout 300 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10
el "gpu tests"
cd $OUT && tar czf r.tgz r && rm -rf r
