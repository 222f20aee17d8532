#!/usr/bin/env bash
# Issue 14 round: flag-protocol floor, sequence-number protocol latency, staged path (mixed and
# MPS), bytes moved by the kernels (ncu). One device call.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; nproc; date -u; } > $R/host.txt 2>&1
el start
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl build rc=$?" ) &
( make -C $SRC -j4 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl build rc=$?" ) &
nvcc -O2 $GEN bench/gpu/flag_protocol.cu -I$MPI_HOME/include -L$MPI_HOME/lib -lcuda -lmpi -o $BUILD/flag_protocol 2>&1 | tail -3
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw 2>&1 | tail -3
nvcc -O2 $GEN bench/gpu/copy_bw.cu -o $BUILD/copy_bw 2>&1 | tail -3
el "tools built"
# 1. The protocol floor, no MPS (ferroccl not involved).
for np in 2 4 8; do timeout 60 mpirun -np $np --bind-to none $BUILD/flag_protocol 2000 2>&1 | tee -a $R/flag_protocol.txt; done
el "flag protocol"
# 2. ferroccl's GPU integration tests (the new flag protocol, abort, graphs).
export LD_LIBRARY_PATH=$PFX/lib
( timeout 150 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" ) | tee -a $R/summary.txt
grep -E "^test |test result" $R/it-cuda.txt
el "it"
wait
el "nccl-tests built"
F=$BUILD/f; N=$BUILD/n
lat() { # label np bin args
  local l=$1 np=$2 b=$3; shift 3
  timeout 120 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -E '^ +8 ' $R/$l.log | head -1 | awk '{print "8B oop", $6, "us ip", $10, "us"}')" | tee -a $R/summary.txt
}
# 3. Latency: NCCL 1 rank reference, ferroccl 1/2/4/8 ranks, plain and graphs.
LD_LIBRARY_PATH= lat nccl-np1 1 $N/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 200 -w 20
for np in 1 2 4 8; do lat fer-np$np $np $F/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 200 -w 20; done
for np in 2 4; do lat fer-graph-np$np $np $F/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 20 -w 5 -G 10; done
el "latency"
# 4. Correctness of the new protocol: every type and operator, plain and graph, and the others.
for np in 2 4; do
  lat matrix-ar-np$np $np $F/all_reduce_perf -b 8 -e 1M -f 32 -d all -o all -c 1 -n 2 -w 1
  lat matrix-ar-graph-np$np $np $F/all_reduce_perf -b 8 -e 1M -f 32 -d all -o all -c 1 -n 2 -w 1 -G 2
  for t in all_gather reduce_scatter broadcast reduce alltoall; do lat matrix-$t-np$np $np $F/${t}_perf -b 8 -e 1M -f 32 -c 1 -n 2 -w 1; done
done
el "matrix"
# 5. Staged path over sockets: both ranks device, and rank 0 only (no turn-taking on the GPU).
st() { # label args
  local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; cat $R/staged-$l.txt | grep -v "^\[" | tail -12
}
unset FERROCCL_BENCH_PSK
st plain-both 1 256
st plain-mixed 1 256 mixed
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round17
st tls-mixed 1 256 mixed
unset FERROCCL_BENCH_PSK
el "staged"
# 6. Bytes moved by the kernels (ncu): all_reduce 256 MiB at 2 ranks (rank 0 runs all kernels), and the copy.
$BUILD/copy_bw 1024 > $R/copy_bw.txt 2>&1; cat $R/copy_bw.txt
timeout 120 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH \
  ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum --target-processes all -c 3 \
  $F/all_reduce_perf -b 256M -e 256M -c 0 -n 1 -w 0 > $R/ncu-ar-np2.txt 2>&1
echo "ncu ar np2 rc=$?"; grep -E "fold|dram__|gpu__time|==PROF==|Error" $R/ncu-ar-np2.txt | head -30
timeout 120 mpirun -np 4 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH \
  ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum --target-processes all -c 3 \
  $F/all_gather_perf -b 256M -e 256M -c 0 -n 1 -w 0 > $R/ncu-ag-np4.txt 2>&1
echo "ncu ag np4 rc=$?"; grep -E "dram__|gpu__time" $R/ncu-ag-np4.txt | head -12
el "ncu"
# 7. With the MPS daemon: the floor and the latency.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && el "mps up"
for np in 2 4 8; do timeout 60 mpirun -np $np --bind-to none -x CUDA_MPS_PIPE_DIRECTORY $BUILD/flag_protocol 2000 2>&1 | tee -a $R/flag_protocol-mps.txt; done
for np in 2 4 8; do lat mps-fer-np$np $np $F/all_reduce_perf -b 8 -e 64K -f 8 -c 1 -n 200 -w 20; done
st mps-plain-both 1 256
echo quit | nvidia-cuda-mps-control
el "mps done"
cd $OUT && tar czf r.tgz r && rm -rf r
