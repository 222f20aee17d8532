#!/usr/bin/env bash
# Round 49: are the staged path's random millisecond stalls the GPU switching between the two
# processes' contexts (no MPS: time slices) rather than the library? staged_bw 1-64 MiB with
# and without MPS (one shared context; server and clients checked in its log), alternating,
# plaintext and TLS.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1; shift
  timeout 110 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x FERROCCL_BENCH_PSK -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$? $(date +%T)"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | tail -8; }
mps_on() { export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog; nvidia-cuda-mps-control -d; echo "mps up rc=$?"; }
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; export CUDA_MPS_PIPE_DIRECTORY=/tmp/none CUDA_MPS_LOG_DIRECTORY=/tmp/none; }
export CUDA_MPS_PIPE_DIRECTORY=/tmp/none CUDA_MPS_LOG_DIRECTORY=/tmp/none
unset FERROCCL_BENCH_PSK
for rep in 1 2; do
  st plain-nomps-$rep 1 64
  mps_on; st plain-mps-$rep 1 64; mps_off
done
grep -ciE "new client" /tmp/mpslog/control.log 2>/dev/null | sed 's/^/mps clients seen: /'
el "plaintext"
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round49
st tls-nomps 1 64
mps_on; st tls-mps 1 64; mps_off
el "tls"
cp /tmp/mpslog/control.log $R/mps-control.log 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r
