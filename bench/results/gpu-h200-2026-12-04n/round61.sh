#!/usr/bin/env bash
# Round 61 (one H200): review fixes (early failures still write the flags, abort releases the
# new waits, reduce-scatter own blocks only when every GPU reaches every other), sends to self
# copied on the stream (all-to-all was staged for its own block), one flag batch per step.
# GPU tests (with the abort of a held device send); data checks; sendrecv and alltoall perf.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mps_on() { export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog; nvidia-cuda-mps-control -d; echo "mps up rc=$?"; }
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; export CUDA_MPS_PIPE_DIRECTORY=/tmp/none CUDA_MPS_LOG_DIRECTORY=/tmp/none; }
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
( LD_LIBRARY_PATH=$PFX/lib timeout 200 .dev/it cuda --test-threads 1 --nocapture > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED|stream released" $R/it-cuda.txt | head -12
wait
el "built + it"
F=$BUILD/f
run() { # label np extra-env bin args
  local l=$1 np=$2 env=$3 b=$4; shift 4
  timeout 150 env $env mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib -x FERROCCL_TIMEOUT -x NCCL_P2P_DISABLE -x FERROCCL_PEER_PATH_ON_ONE_GPU -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/$l.log | sort -u | tr '\n' ' ') | $(grep -E '^ +[0-9]+ ' $R/$l.log | awk '$1==8 || $1==2048 || $1==1048576 || $1==33554432 || $1==536870912 {printf "%s:%sus/%s ", $1, $6, $7}')"
}
for np in 2 4; do
  run chk-sr-np$np $np "" $F/sendrecv_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
  run chk-a2a-np$np $np "" $F/alltoall_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
done
run chk-peer-rs-np3 3 "FERROCCL_PEER_PATH_ON_ONE_GPU=1" $F/reduce_scatter_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
run chk-peer-ag-np3 3 "FERROCCL_PEER_PATH_ON_ONE_GPU=1" $F/all_gather_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
el "checks"
run sr-direct 2 "" $F/sendrecv_perf -b 8 -e 1G -f 4 -c 1 -n 20 -w 5
run a2a-direct-np4 4 "" $F/alltoall_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
run a2a-staged-np4 4 "NCCL_P2P_DISABLE=1" $F/alltoall_perf -b 8 -e 64M -f 4 -c 1 -n 5 -w 2
mps_on
run sr-direct-mps 2 "" $F/sendrecv_perf -b 8 -e 1G -f 4 -c 1 -n 20 -w 5
run a2a-direct-np4-mps 4 "" $F/alltoall_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
mps_off
el "perf"
cd $OUT && tar czf r.tgz r && rm -rf r
