#!/usr/bin/env bash
# Round 76 (the H200 machine; issue 18), READY for a session with a GPU: device sends and
# receives between rank threads of one process, written without a GPU (d9fef3d..: by address;
# threads on one GPU only with FERROCCL_PEER_PATH_ON_ONE_GPU=1, taking turns through
# local_order; staged otherwise). First the thread tests alone with the P2P log (the peer-path
# test runs its children with the switch: "P2P/direct" lines expected there only), then on one
# hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, where a wait queued before its write stops
# for good), then every GPU test. Carry .dev (prefix, .dev/it the GPU test binary of one build).
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
timeout 300 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10
el "gpu tests"
cd $OUT && tar czf r.tgz r && rm -rf r
