#!/usr/bin/env bash
# Round 135 (device machine, 2026-12-07). (2) first, then (1). (1) GPU tests and nccl-tests' correctness check at
# ba29927 (dc25db8: coll::stream's Claim::take / take_host_written now share one body): the CUDA test
# suite, then all_reduce and all_gather through the one-GPU path and through the staged path.
# (2) Issue 15: Open MPI beat both all-gather paths at 2 MiB with fresh inputs (round 132),
# even the pull of ncclMemAlloc inputs in place. ba29927 adds the relay (each rank copies from
# its left neighbour's output, as a ring). 8 and 16 ranks, 512 KiB-4 MiB, fresh inputs: the
# rule (slots to 1 MiB, kernel copies above), kernel copies at every size (pull), the relay
# at every size (kernel copies), ncclMemAlloc by pull and by relay, Open MPI; reused inputs:
# the rule, the relay, Open MPI. Two alternations, then 4 ranks once.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; lscpu | grep -E "L2|L3"; nvidia-smi -L; uname -r; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, program and its arguments
  local l=$1 np=$2; shift 2
  printf "%-13s np%-2s all_gather " $l $np
  timeout 40 mpirun -np $np --bind-to none "$@" -b 512K -e 4M -f 2 -n 50 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
KC="-x FERROCCL_NODE_STAGE_MAX=0"; RL="-x FERROCCL_NODE_STAGE_MAX=0 -x FERROCCL_NODE_RELAY_MIN=0"
sweep() { # np
  local np=$1 f=--fresh-inputs
  line dflt-fresh $np $B all_gather $f
  line kc-fresh $np $KC $B all_gather $f
  line relay-fresh $np $RL $B all_gather $f
  line nccl-fresh $np $B all_gather --alloc nccl $f
  line ncrelay-fresh $np -x FERROCCL_NODE_RELAY_MIN=0 $B all_gather --alloc nccl $f
  line ompi-fresh $np /tmp/ompi_bench -C all_gather $f
  line dflt-reused $np $B all_gather
  line relay-reused $np $RL $B all_gather
  line ompi-reused $np /tmp/ompi_bench -C all_gather
}
for i in 1 2; do for np in 8 16; do
  before 280 || break 2
  sweep $np
done; done 2>&1 | tee $R/ag.txt
before 300 && sweep 4 2>&1 | tee -a $R/ag.txt
el "all-gather"
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
timeout 120 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"; grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
wait
el "builds"
F=$BUILD/f
nt() { # label, test, extra mpirun args...
  local l=$1 t=$2; shift 2
  timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib "$@" \
    $F/${t}_perf -b 8 -e 64M -f 8 -c 1 -n 5 -w 2 > $R/nt-$l-$t.log 2>&1
  echo "== $l $t rc=$? $(grep -E 'Out of bounds' $R/nt-$l-$t.log | awk '{print $(NF-1), $NF}')"
}
for t in all_reduce all_gather; do
  nt onegpu $t
  nt staged $t -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo
done 2>&1 | tee $R/nt.txt
el "nccl-tests"
el end
cd $OUT && tar czf r.tgz r && rm -rf r
