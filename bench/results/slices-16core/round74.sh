#!/usr/bin/env bash
# Round 74 (16-core host of the GPU machine; issue 15), READY: bench/slice_bench.c (slices of
# 64 MiB malloc'd arrays, ferroccl next to Open MPI in one program) at 2, 8 and 16 ranks,
# FERROCCL_HUGE_PAGES off and on alternating, two launches each; then the GPU tests.
# Carry .dev (prefix from `make install PREFIX=$PWD/.dev/prefix TLS_BACKEND=OPENSSL3 MPI=1`,
# static libraries removed; .dev/it the GPU test binary).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
P=$PWD/.dev/prefix
mpicc -O2 bench/slice_bench.c -I$P/include -L$P/lib -lferroccl -Wl,-rpath,$P/lib -o $R/slice_bench || exit 1
(nproc; lscpu | grep -E "Model name|Socket|NUMA node\(s\)"; cat /sys/kernel/mm/transparent_hugepage/enabled; uname -r) > $R/machine.txt
for np in 2 8 16; do for launch in 1 2; do for hp in 0 1; do
  echo "== np $np launch $launch FERROCCL_HUGE_PAGES=$hp" >> $R/slices.txt
  grep -E "^cpu " /proc/stat >> $R/slices.txt
  timeout 120 mpirun -np $np --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_HUGE_PAGES=$hp \
    $R/slice_bench -s 32K,128K,512K -n $(( np == 2 ? 300 : 100 )) -r 5 >> $R/slices.txt 2>&1; echo "rc=$?" >> $R/slices.txt
  grep -E "^cpu " /proc/stat >> $R/slices.txt
done; done; done
grep -vE "^#|^cpu" $R/slices.txt | head -120; el slices
timeout 200 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"; tail -3 $R/gpu-tests.txt; el gpu
cd $OUT && tar czf r.tgz r && rm -rf r
