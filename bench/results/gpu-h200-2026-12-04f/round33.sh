#!/usr/bin/env bash
# Round 33: the staged path against its floor on this host: a host-buffer all-reduce while the
# stream runs the same copies (host memory bandwidth shared with the DMA), build 560c1aa+.
set -u
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
st() { local l=$1; shift
  timeout 200 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | tail -12; }
unset FERROCCL_BENCH_PSK
st plain-1 1 256; st plain-2 1 256
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round33
st tls 1 256
cd $OUT && tar czf r.tgz r && rm -rf r
