#!/usr/bin/env bash
# Round 78 (one H200; the GPU test that stops now and then): device_scalar_and_graph_threads_1_2_3
# on one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) and with the default 8 and 32, alone, with
# thread backtraces (cuda-gdb attached) of any run still going after 45 s; then every other GPU
# test. Hypothesis: the graph-captured flag waits of rank threads on one GPU are not taken in
# turns, so two rank streams on one hardware queue wait on each other. .dev/it-old: 6b230bd's
# test binary (captures allowed); .dev/it: captures by threads sharing the GPU refused.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export FERROCCL_TIMEOUT=30
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
cat .dev/build.commit
watch_run() {
  local name=$1 bin=$2; shift 2
  env "$@" $bin --exact cuda::device_scalar_and_graph_threads_1_2_3 --nocapture --test-threads 1 > $R/$name.txt 2>&1 &
  local pid=$! i
  for i in $(seq 1 45); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    timeout 60 cuda-gdb -p $pid -batch -ex "info threads" -ex "thread apply all bt 14" > $R/$name.bt 2>&1
    kill -9 $pid
  fi
  wait $pid; echo "$name rc=$? $(grep -E 'test result' $R/$name.txt) $(grep -m1 -E 'panicked|not through' $R/$name.txt)"
}
watch_run old-one-queue .dev/it-old CUDA_DEVICE_MAX_CONNECTIONS=1
watch_run old-conn32 .dev/it-old CUDA_DEVICE_MAX_CONNECTIONS=32
watch_run new-one-queue .dev/it CUDA_DEVICE_MAX_CONNECTIONS=1
watch_run new-default .dev/it X=1
el "graph test"
ls $R/*.bt 2>/dev/null && grep -E "^#[0-9]+ .* in (ferroccl|it::|cu[A-Z]|std::thread)" $R/*.bt | awk '{$1=$1};1' | cut -c1-200 | head -60
timeout 240 .dev/it cuda --test-threads 1 > $R/gpu-tests-rest.txt 2>&1; echo "all gpu tests rc=$?"
grep -E "^test |test result|panicked" $R/gpu-tests-rest.txt | head -30
el "rest"
cd $OUT && tar czf r.tgz r && rm -rf r
