#!/usr/bin/env bash
# Round 102 (device machine, 2026-12-06): the staged broadcast root's early return at 8 and 16
# ranks on the 16-core host, and a GPU regression check of this build. Carry .dev (built at
# the commit in .dev/build.commit; .dev/bin/ferroccl-bench-old = 002de16).
#  1. GPU tests (tests/it cuda*) and nccl-tests smoke (bench/gpu/nccl_tests.sh).
#  2. Broadcast 8 KiB-8 MiB, malloc'd buffers, alternating old / new / Open MPI, three times,
#     at 16 and 8 ranks; the new build with ncclMemAlloc buffers once per alternation.
#  3. The new build with slots of 256 KiB and 4 MiB (FERROCCL_NODE_SLOT_SIZE), twice.
#  4. Whether perf exists there.
#   PART="gpu ab slots" bash bench/results/bcast-root-return/round102.sh
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u;
  echo "perf: $(command -v perf || echo none) $(ls /usr/bin/perf* 2>/dev/null | tr '\n' ' ')"; } > $R/host.txt 2>&1
cat $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
PART=${PART:-gpu ab slots}
if [[ " $PART " == *" gpu "* ]]; then
  timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
  grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
  timeout 200 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests smoke > $R/nccl-tests-smoke.txt 2>&1; el "nccl-tests smoke rc=$?"
  sed -n '/==== summary/,$p' $R/nccl-tests-smoke.txt
fi
mpicc -O2 -o /tmp/ompi_bench_r102 bench/ompi_bench.c || exit 1
line() {  # label, np, then env/bench args: one line, "size us" pairs (out of place)
  local l=$1 np=$2; shift 2
  printf "%-10s np%-2s " $l $np
  timeout 60 mpirun -np $np --bind-to none "$@" -b 8K -e 8M -f 4 -n 200 -w 20 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
if [[ " $PART " == *" ab "* ]]; then
  for np in 16 8; do for i in 1 2 3; do
    line old $np $B-old broadcast
    line new $np $B broadcast
    line ompi $np /tmp/ompi_bench_r102 -C broadcast
    line memalloc $np $B broadcast --alloc nccl
  done; done > $R/ab.txt 2>&1
  cat $R/ab.txt; el "A/B"
fi
if [[ " $PART " == *" slots "* ]]; then
  for np in 16 8; do for i in 1 2; do
    line slot256K $np -x FERROCCL_NODE_SLOT_SIZE=256K $B broadcast
    line slot1M $np $B broadcast
    line slot4M $np -x FERROCCL_NODE_SLOT_SIZE=4M $B broadcast
  done; done > $R/slots.txt 2>&1
  cat $R/slots.txt; el "slots"
fi
el done
