#!/usr/bin/env bash
# Round 30: why one piecewise 64 MiB staged operation runs the engine at half speed. Before
# (separate piece operations), before whole (FERROCCL_STAGE_PIECE=1G: one operation, no
# pieces), after, and D (after, but the engine starts only once all input has landed).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
st() { # label libdir args
  local l=$1 lib=$2; shift 2
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_STAGE_PIECE -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v "NCCL INFO\|NCCL TRACE" | tail -4
}
B=$PWD/.dev/prefix-b/lib; D=$PWD/.dev/prefix-d/lib
for rep in 1 2; do
  st before-$rep $B 16 128
  FERROCCL_STAGE_PIECE=1073741824 st before-whole-$rep $B 16 128
  st after-$rep $PFX/lib 16 128
  st d-$rep $D 16 128
done
el "runs"
export NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL
NCCL_DEBUG_FILE=$R/trace-d.%h.%p st trace-d $D 64 64
NCCL_DEBUG_FILE=$R/trace-whole.%h.%p FERROCCL_STAGE_PIECE=1073741824 st trace-whole $B 64 64
el "traced"
cd $OUT && tar czf r.tgz r && rm -rf r
