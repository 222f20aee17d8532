#!/usr/bin/env bash
# Round 36: round 35's trace shows a rank's copies in pausing for 250-300 us while the other
# process's context has the GPU (two processes share the one GPU: time slices). With MPS both
# processes' work runs in one context; staged_bw without and with MPS, alternating; a trace
# at 4 MiB under MPS.
set -u
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
st() { local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK -x CUDA_MPS_PIPE_DIRECTORY -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | tail -9; }
mps_on() { export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog; nvidia-cuda-mps-control -d; echo "mps up rc=$?"; }
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
unset FERROCCL_BENCH_PSK
for rep in 1 2; do
  st nomps-$rep 1 256
  mps_on; st mps-$rep 1 256; mps_off
done
mps_on
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round36
st mps-tls 1 256
unset FERROCCL_BENCH_PSK
NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=$R/trace-mps-4.%h.%p st mps-trace 4 4
mps_off
cat /tmp/mpslog/control.log 2>/dev/null | tail -5
cd $OUT && tar czf r.tgz r && rm -rf r
