#!/usr/bin/env bash
# Round 111 (device machine, 2026-12-06): the library built as one optimisation unit (fat LTO,
# codegen-units = 1) against the previous profile, small calls on the 16-core host, and a GPU
# regression check of the LTO build. Carry .dev (.dev/build.commit; .dev/bin/ferroccl-bench-base
# = the same source built with the old profile).
#  1. GPU tests (tests/it cuda*) and nccl-tests smoke (bench/gpu/nccl_tests.sh).
#  2. 8 B-8 KiB broadcast and all-reduce, malloc'd buffers, alternating base / lto / Open MPI,
#     three times, at 2, 8 and 16 ranks.
#  3. 8 KiB-8 MiB all-reduce at 2 and 16 ranks, base / lto / Open MPI, twice (nothing lost).
#   PART="gpu small mid" bash bench/results/lto-call-path/round111.sh
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
PART=${PART:-gpu small mid}
if [[ " $PART " == *" gpu "* ]]; then
  timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
  grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
  timeout 200 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests smoke > $R/nccl-tests-smoke.txt 2>&1; el "nccl-tests smoke rc=$?"
  sed -n '/==== summary/,$p' $R/nccl-tests-smoke.txt
fi
mpicc -O2 -o /tmp/ompi_bench_r111 bench/ompi_bench.c || exit 1
line() {  # label, np, sizes b e, iterations, then the program and its arguments: "size us" pairs
  local l=$1 np=$2 b=$3 e=$4 n=$5; shift 5
  printf "%-5s np%-2s " $l $np
  timeout 90 mpirun -np $np --bind-to none "$@" -b $b -e $e -f 4 -n $n -w $((n / 10 + 5)) 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
if [[ " $PART " == *" small "* ]]; then
  for np in 2 8 16; do
    n=20000; [ $np -gt 2 ] && n=5000
    for c in broadcast all_reduce; do for i in 1 2 3; do
      line base $np 8 8K $n $B-base $c
      line lto $np 8 8K $n $B $c
      line ompi $np 8 8K $n /tmp/ompi_bench_r111 -C $c
    done; done
  done > $R/small.txt 2>&1
  cat $R/small.txt; el "small"
fi
if [[ " $PART " == *" mid "* ]]; then
  for np in 2 16; do for i in 1 2; do
    line base $np 8K 8M 100 $B-base all_reduce
    line lto $np 8K 8M 100 $B all_reduce
    line ompi $np 8K 8M 100 /tmp/ompi_bench_r111 -C all_reduce
  done; done > $R/mid.txt 2>&1
  cat $R/mid.txt; el "mid"
fi
el done
