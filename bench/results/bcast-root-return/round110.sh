#!/usr/bin/env bash
# Round 110 (device machine, 2026-12-06): GPU regression check at the final build, then every
# collective at 8 and 16 ranks in buffers of the message's own size (one size per launch, as
# an application's array of that size; the benchmark's sweeps use buffers sized for their
# largest message), ferroccl (malloc'd) against Open MPI, two alternations. Carry .dev.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u; } > $R/host.txt 2>&1
if [ "${GPU:-1}" = 1 ]; then
  timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
  grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
  timeout 200 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests smoke > $R/nccl-tests-smoke.txt 2>&1; el "nccl-tests smoke rc=$?"
  sed -n '/==== summary/,$p' $R/nccl-tests-smoke.txt
fi
mpicc -O2 -o /tmp/ompi_bench_r110 bench/ompi_bench.c || exit 1
B=$PWD/.dev/bin/ferroccl-bench
one() {  # np coll size program...
  local np=$1 c=$2 s=$3; shift 3
  timeout 60 mpirun -np $np --bind-to none "$@" $c -b $s -e $s -n 20 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s", $6} /[Ee]rror|failed|panick/{print}'
}
for i in 1 2; do for np in 16 8; do for c in all_reduce all_gather reduce_scatter broadcast; do
  for s in 128K 512K 2M 8M; do
    left=$(( ${LIMIT:-520} - ($(date +%s) - T0) )); [ $left -lt 20 ] && break 4
    ccl=$(one $np $c $s $B)
    mpi=$(one $np $c $s /tmp/ompi_bench_r110 -C)
    echo "rep$i np$np $c $s ferroccl $ccl ompi $mpi"
  done
done; done; done > $R/own-size.txt 2>&1
cat $R/own-size.txt; el done
