#!/usr/bin/env bash
# Round 41 (1f8be3c + staging back to the pool before the streams are released + wall-clock
# TRACE): GPU tests; copy and memset bandwidth (the write-only ceiling); staged_bw twice; a
# TRACE of 1-2 MiB staged jobs with both ranks' timelines on one clock.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
nvcc -O2 $GEN bench/gpu/copy_bw.cu -o $BUILD/copy_bw > $R/copy_build.txt 2>&1; echo "copy_bw build rc=$?"
( LD_LIBRARY_PATH=$PFX/lib timeout 120 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -20
el "it"
$BUILD/copy_bw 1024 > $R/copy_bw-1.txt 2>&1; cat $R/copy_bw-1.txt
$BUILD/copy_bw 256 > $R/copy_bw-256.txt 2>&1; cat $R/copy_bw-256.txt
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x FERROCCL_BENCH_PSK -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | tail -8; }
unset FERROCCL_BENCH_PSK
st plain-1 1 64
NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=$R/trace-12.%h.%p st trace 1 2
grep -h "staging pool" $R/trace-12.* | head -20
st plain-2 1 64
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
