#!/usr/bin/env bash
# Round 114 (device machine, 2026-12-06): kernel copies into scratch at the other end's page
# offset (8ebbb18) on the Intel 16-core host, and a GPU regression check of that build. Carry
# .dev: ferroccl-bench = 8ebbb18, ferroccl-bench-prev = 763e563 (both fat LTO).
#  1. GPU tests (tests/it cuda*) and nccl-tests smoke.
#  2. bench/page_offset_probe.c at 64 KiB and 256 KiB pieces: is the slow window there too?
#  3. all-reduce and reduce-scatter 64 KiB-64 MiB, malloc'd buffers, prev / new / Open MPI,
#     alternating twice, at 2, 8 and 16 ranks.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
timeout 200 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests smoke > $R/nccl-tests-smoke.txt 2>&1; el "nccl-tests smoke rc=$?"
sed -n '/==== summary/,$p' $R/nccl-tests-smoke.txt
gcc -O2 -o /tmp/pop bench/page_offset_probe.c && { /tmp/pop 64; /tmp/pop 256; } 2>&1 | tee $R/probe.txt
el probe
mpicc -O2 -o /tmp/ompi_bench_r114 bench/ompi_bench.c || exit 1
line() {  # label, np, then the program and its arguments: "size us" pairs
  local l=$1 np=$2; shift 2
  printf "%-5s np%-2s " $l $np
  timeout 120 mpirun -np $np --bind-to none "$@" -b 64K -e 64M -f 4 -n 20 -w 3 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for np in 2 8 16; do for c in all_reduce reduce_scatter; do for i in 1 2; do
  line prev $np $B-prev $c
  line new $np $B $c
  line ompi $np /tmp/ompi_bench_r114 -C $c
done; done; done 2>&1 | tee $R/ab.txt
el done
