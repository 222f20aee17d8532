#!/usr/bin/env bash
# Round 35: per-request TRACE of staged jobs (when each send and receive is posted and done,
# and every sleep of the executor in poll), 4 and 16 MiB, to find the multi-ms stalls.
set -u
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
export NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL
for m in 4 16; do
  timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE=$R/trace-$m.%h.%p $BUILD/staged_bw $m $m > $R/staged-$m.txt 2>&1
  echo "== $m rc=$?"; grep -v "^\[" $R/staged-$m.txt | grep -v NCCL | tail -2
done
cd $OUT && tar czf r.tgz r && rm -rf r
