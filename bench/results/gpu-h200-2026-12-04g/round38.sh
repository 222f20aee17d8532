#!/usr/bin/env bash
# Round 38 (build 1f8be3c): GPU tests on the last two unverified commits; does a stream held on
# a flag wait stall another process's copies (wait_contention, without and with MPS, MPS
# checked live); staged_bw with device buffers on one rank only against on both; issue 15's
# 16-rank small-message check, 91b60c3 against this build, alternating.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN bench/gpu/wait_contention.cu -I$MPI_HOME/include -L$MPI_HOME/lib -lcuda -lmpi -o $BUILD/wait_contention > $R/wc_build.txt 2>&1; echo "wait_contention build rc=$?"
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
( LD_LIBRARY_PATH=$PFX/lib timeout 120 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -20
el "it"
wc() { local l=$1; shift; timeout 60 mpirun -np 2 --bind-to none -x CUDA_MPS_PIPE_DIRECTORY $BUILD/wait_contention "$@" > $R/wc-$l.txt 2>&1; echo "== wc $l rc=$?"; grep -v "^\[" $R/wc-$l.txt | tail -6; }
mps_on() { export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog; nvidia-cuda-mps-control -d; echo "mps up rc=$?"; }
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
export CUDA_MPS_PIPE_DIRECTORY=/tmp/none
wc nomps 16 256 21
wc nomps-64k 64 64 21
mps_on
wc mps 16 256 21
echo get_server_list | nvidia-cuda-mps-control > $R/mps-servers.txt 2>&1; echo "mps servers: $(cat $R/mps-servers.txt | tr '\n' ' ')"
grep -iE "server|client" /tmp/mpslog/control.log 2>/dev/null | tail -6
mps_off
export CUDA_MPS_PIPE_DIRECTORY=/tmp/none
el "wait_contention"
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1; shift
  timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x STAGED_BW_DEVICE_RANK $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | tail -6; }
for rep in 1 2; do
  unset STAGED_BW_DEVICE_RANK; st both-$rep 1 16
  export STAGED_BW_DEVICE_RANK=0; st one-$rep 1 16
done
unset STAGED_BW_DEVICE_RANK
el "staged"
OLD=$PWD/.dev/bin/ferroccl-bench-91b60c3 NEW=$PWD/.dev/bin/ferroccl-bench
b16() { local l=$1 bin=$2; shift 2
  timeout 60 mpirun -np 16 --bind-to none $bin "$@" > $R/np16-$l.txt 2>&1
  echo "np16 $l rc=$? $(awk '$1 ~ /^[0-9]+$/ {printf "%s:%s ", $1, $6}' $R/np16-$l.txt)"; }
for rep in 1 2; do
  b16 bc-old-$rep $OLD broadcast -b 8 -e 2K -f 4 -n 1000 -w 100
  b16 bc-new-$rep $NEW broadcast -b 8 -e 2K -f 4 -n 1000 -w 100
  b16 ar-old-$rep $OLD all_reduce -b 8 -e 2M -f 4 -n 300 -w 50
  b16 ar-new-$rep $NEW all_reduce -b 8 -e 2M -f 4 -n 300 -w 50
done
el "np16"
cd $OUT && tar czf r.tgz r && rm -rf r
