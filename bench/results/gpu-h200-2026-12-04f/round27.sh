#!/usr/bin/env bash
# Round 27: where the staged path's time goes below 64 MiB. staged_bw now also times the two
# copies alone; the worker logs (TRACE, COLL) how long it waited for the copies in and how
# long the host engine ran. A: current wait (spin, then 5 us sleeps); B: spin, then yield.
set -u
T0=$(date +%s)
BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
st() { # label libdir args
  local l=$1 lib=$2; shift 2
  timeout 120 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v "NCCL INFO\|NCCL TRACE" | tail -9
}
A=$PWD/.dev/prefix/lib; B=$PWD/.dev/prefix-b/lib
for rep in 1 2; do
  st a-$rep $A 1 64
  st b-$rep $B 1 64
done
el "plain"
export NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL
NCCL_DEBUG_FILE=$R/trace-a.%h.%p st trace-a $A 1 16
NCCL_DEBUG_FILE=$R/trace-b.%h.%p st trace-b $B 1 16
el "traced"
ls $R | head -20
cd $OUT && tar czf r.tgz r && rm -rf r
