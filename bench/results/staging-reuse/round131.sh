#!/usr/bin/env bash
# Round 131 (device machine, 2026-12-06 night). (1) GPU tests at ffcb302: staged calls on one
# stream reuse staging buffers still in flight (coll::staging_pool, d304c3c + ffcb302), with a new test queuing
# staged calls back to back. (2) Issue 14: nccl-tests' staged all-reduce at 35/70/140 MB with
# 20 timed calls queued before each synchronise, the build before (7479d84, .dev/prefix-prev)
# against ffcb302, alternating, and the pool's new pinned buffers counted (NCCL_DEBUG=TRACE,
# COLL). (3) Issue 15: the all-gather's stage rule at 4 and 8 ranks with fresh inputs:
# FERROCCL_NODE_STAGE_MAX unset (64 KiB at 3-8 ranks) / 256K / 1M / 4M, next to ncclMemAlloc
# buffers and Open MPI.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
timeout 120 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"; grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
wait
el "builds"
F=$BUILD/f
nt() { # label, prefix dir, extra mpirun args...
  local l=$1 p=$2; shift 2
  timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/$p/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo "$@" \
    $F/all_reduce_perf -b 35000000 -e 140000000 -f 2 -c 1 -n 20 -w 5 > $R/nt-$l.log 2>&1
  echo "== $l rc=$? $(grep -c 'new pinned buffer' $R/nt-$l.log) new pinned buffers; $(grep -E 'Out of bounds' $R/nt-$l.log | awk '{print $(NF-1), $NF}')"
  grep -E "^ +[0-9]+ " $R/nt-$l.log
}
for i in 1 2; do
  before 130 || break
  nt prev-$i prefix-prev
  nt new-$i prefix
done 2>&1 | tee $R/nt.txt
before 160 && nt new-trace prefix -x NCCL_DEBUG=TRACE -x NCCL_DEBUG_SUBSYS=COLL | tee -a $R/nt.txt
before 175 && nt prev-trace prefix-prev -x NCCL_DEBUG=TRACE -x NCCL_DEBUG_SUBSYS=COLL | tee -a $R/nt.txt
el "nccl-tests staged"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, collective, program and its arguments
  local l=$1 np=$2 c=$3; shift 3
  printf "%-6s np%-2s %-10s " $l $np $c
  timeout 60 mpirun -np $np --bind-to none "$@" -b 32K -e 4M -f 2 -n 200 -w 20 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2; do for np in 8 4; do c=all_gather; [ $i = 2 ] && [ $np = 4 ] && break
  before 195 || break 2
  line dflt $np $c $B $c --fresh-inputs
  line s256k $np $c -x FERROCCL_NODE_STAGE_MAX=256K $B $c --fresh-inputs
  line s1m $np $c -x FERROCCL_NODE_STAGE_MAX=1M $B $c --fresh-inputs
  line s4m $np $c -x FERROCCL_NODE_STAGE_MAX=4M $B $c --fresh-inputs
  line nccl $np $c $B $c --alloc nccl --fresh-inputs
  [ $i = 1 ] && line ompi $np $c /tmp/ompi_bench -C $c --fresh-inputs
done; done 2>&1 | tee $R/ag-stage.txt
el "all-gather stage"
cd $OUT && tar czf r.tgz r && rm -rf r
