#!/usr/bin/env bash
# (1) Is the intermittent GPU-test stop a hardware-queue false dependency? Rank threads' streams
#     wait on each other; CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS queues (default 8).
#     With 1 queue it must stop every time; with 32 never. (2) Staged pieces, 2 in flight.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl build rc=$?" ) &
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
export LD_LIBRARY_PATH=$PFX/lib
for c in 1 2; do
  ( CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 100 .dev/it cuda::device_buffers_threads_2_and_3 --test-threads 1 > $R/conn$c.txt 2>&1; echo "connections=$c threads_2_and_3 rc=$?"; grep -E "panicked at|not through" $R/conn$c.txt | head -3 )
done
for i in 1 2; do
  ( CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 200 .dev/it cuda:: --test-threads 1 > $R/it32-$i.txt 2>&1; echo "connections=32 cuda:: run $i rc=$?"; grep -E "test result|FAILED|panicked at" $R/it32-$i.txt | head -5 )
done
wait
el "it"
F=$BUILD/f
export NCCL_P2P_DISABLE=1
timeout 150 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE $F/all_reduce_perf -b 1M -e 64M -f 4 -d float,half -o sum,max -c 1 -n 2 -w 1 > $R/staged-ar.log 2>&1; echo "staged check rc=$? $(grep 'Out of bounds' $R/staged-ar.log)"
unset NCCL_P2P_DISABLE
st() { # label args
  local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK -x FERROCCL_STAGE_PIECE $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | tail -9
}
unset FERROCCL_BENCH_PSK
for p in 1048576 4194304 1048576; do FERROCCL_STAGE_PIECE=$p st plain-$p 1 256; done
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
