#!/usr/bin/env bash
# Round 51 (build 4b5620e, yield while transfers are posted): the staged path over the whole
# range, 1-256 MiB, plaintext twice and TLS once, for the record; and 1-16 MiB with the
# calling thread sleeping in cudaStreamSynchronize (STAGED_BW_BLOCKING_SYNC=1) instead of
# spinning: does a spinning caller still cost the staged path something?
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x FERROCCL_BENCH_PSK -x STAGED_BW_BLOCKING_SYNC $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$? $(date +%T)"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | grep -v "^#  " | tail -10; }
unset FERROCCL_BENCH_PSK STAGED_BW_BLOCKING_SYNC
st plain-1 1 256
export STAGED_BW_BLOCKING_SYNC=1; st blocking 1 16; unset STAGED_BW_BLOCKING_SYNC
st plain-2 1 256
el "plaintext"
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round51
st tls 1 256
el "tls"
cd $OUT && tar czf r.tgz r && rm -rf r
