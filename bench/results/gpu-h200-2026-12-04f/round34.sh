#!/usr/bin/env bash
# Round 34: are the multi-millisecond stalls inside staged operations CPU starvation? CPU
# limits of this machine, then staged_bw with the benchmark's thread spinning (default) and
# sleeping (cudaDeviceScheduleBlockingSync) in cudaStreamSynchronize, alternating.
set -u
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
echo "nproc $(nproc)"; cat /sys/fs/cgroup/cpu.max 2>/dev/null; cat /proc/pressure/cpu 2>/dev/null; grep -c processor /proc/cpuinfo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
st() { local l=$1; shift
  timeout 200 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x STAGED_BW_BLOCKING_SYNC $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | tail -7; }
for rep in 1 2; do
  unset STAGED_BW_BLOCKING_SYNC; st spin-$rep 1 32
  export STAGED_BW_BLOCKING_SYNC=1; st blocking-$rep 1 32
done
cat /proc/pressure/cpu 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r
