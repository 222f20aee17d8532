#!/usr/bin/env bash
# Issue 14 round 2: no Finished writes (destroy asks the last event), latency alternating with
# NCCL's 1-rank figure, correctness, and the staged path (both device, mixed, MPS).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; nproc; date -u; } > $R/host.txt 2>&1
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl build rc=$?" ) &
( make -C $SRC -j4 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl build rc=$?" ) &
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"; tail -5 $R/staged_build.txt
export LD_LIBRARY_PATH=$PFX/lib
( timeout 150 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" ) | tee -a $R/summary.txt
grep -E "test result|FAIL|panicked" $R/it-cuda.txt | head
wait
el "built + it"
F=$BUILD/f; N=$BUILD/n
lat() { # label np bin args
  local l=$1 np=$2 b=$3; shift 3
  timeout 120 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -E '^ +8 ' $R/$l.log | head -1 | awk '{print "8B oop", $6, "us ip", $10, "us"}')" | tee -a $R/summary.txt
}
for rep in 1 2 3; do
  LD_LIBRARY_PATH= lat nccl-np1-$rep 1 $N/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 200 -w 20
  for np in 2 4; do lat fer-np$np-$rep $np $F/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 200 -w 20; done
done
lat fer-np8 8 $F/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 200 -w 20
for np in 2 4; do lat fer-graph-np$np $np $F/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 20 -w 5 -G 10; done
lat matrix-ar-np4 4 $F/all_reduce_perf -b 8 -e 1M -f 32 -d all -o all -c 1 -n 2 -w 1
lat matrix-ar-graph-np4 4 $F/all_reduce_perf -b 8 -e 1M -f 32 -d all -o all -c 1 -n 2 -w 1 -G 2
lat matrix-ag-np4 4 $F/all_gather_perf -b 8 -e 1M -f 32 -c 1 -n 2 -w 1
lat big-ar-np4 4 $F/all_reduce_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
el "latency + matrix"
st() { # label args
  local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK -x CUDA_MPS_PIPE_DIRECTORY $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | tail -11
}
unset FERROCCL_BENCH_PSK
st plain-both 1 256
st plain-mixed 1 256 mixed
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round18
st tls-both 1 256
st tls-mixed 1 256 mixed
unset FERROCCL_BENCH_PSK
el "staged"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && el "mps up"
for np in 2 4; do lat mps-fer-np$np $np $F/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 200 -w 20; done
st mps-plain-both 1 256
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round18
st mps-tls-both 1 256
echo quit | nvidia-cuda-mps-control
el "mps done"
cd $OUT && tar czf r.tgz r && rm -rf r
