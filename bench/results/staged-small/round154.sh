#!/usr/bin/env bash
# Round 154 (device machine, 2026-12-08): (1) the staged path (device buffers, NCCL_P2P_DISABLE=1,
# sockets) next to host buffers over the same sockets, with the 2 ranks as 2 processes (two
# CUDA contexts, which the GPU takes in turns), as 2 threads of one process (one context), and
# as 2 processes under MPS (bench/gpu/staged_threads.cu); (2) issue 14's small-call targets
# again on this host, three alternations: 8 B all_reduce, NCCL 2.28 on 1 rank against ferroccl
# on 1, 2 and 4 ranks sharing the GPU (nccl-tests, -n 1000).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; P=$PWD/.dev/prefix
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; date -u; } > $R/host.txt 2>&1; cat $R/host.txt
# Built first, not beside the timed runs (the first launch of this round built it in the
# background and spoiled the staged_threads figures).
make -C .dev/nccl-tests -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$P NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR=/tmp/f > /tmp/f.log 2>&1; echo "nccl-tests build rc=$?"
nvcc -O2 -I$P/include -I$MPI_HOME/include bench/gpu/staged_threads.cu -L$P/lib -lnccl -L$MPI_HOME/lib -lmpi -Xlinker -rpath,$P/lib -o /tmp/st > $R/build.log 2>&1 || { cat $R/build.log; exit 1; }
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
timeout 90 mpirun -np 2 --bind-to none $SOCK -x NCCL_DEBUG=WARN /tmp/st 1 > $R/procs.txt 2>&1; el "procs rc=$?"; cat $R/procs.txt
timeout 90 mpirun -np 1 --bind-to none $SOCK -x NCCL_DEBUG=WARN /tmp/st 2 > $R/threads.txt 2>&1; el "threads rc=$?"; cat $R/threads.txt
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d; echo "mps up rc=$?"
timeout 90 mpirun -np 2 --bind-to none -x CUDA_MPS_PIPE_DIRECTORY $SOCK -x NCCL_DEBUG=WARN /tmp/st 1 > $R/procs-mps.txt 2>&1; el "procs mps rc=$?"; cat $R/procs-mps.txt
echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
timeout 90 mpirun -np 1 --bind-to none $SOCK -x NCCL_DEBUG=WARN /tmp/st 2 > $R/threads-2.txt 2>&1; el "threads again rc=$?"; cat $R/threads-2.txt
timeout 90 mpirun -np 2 --bind-to none $SOCK -x NCCL_DEBUG=WARN /tmp/st 1 > $R/procs-2.txt 2>&1; el "procs again rc=$?"; cat $R/procs-2.txt
wait
F=/tmp/f; A="-b 8 -e 8 -c 0 -n 1000 -w 100"
for rep in 1 2 3; do
  timeout 30 $F/all_reduce_perf $A > $R/nccl-np1-$rep.log 2>&1
  for np in 1 2 4; do
    timeout 30 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$P/lib $F/all_reduce_perf $A > $R/ferro-np$np-$rep.log 2>&1
  done
  echo "rep $rep: nccl1 $(awk '/^ +8 /{print $6}' $R/nccl-np1-$rep.log) ferro1 $(awk '/^ +8 /{print $6}' $R/ferro-np1-$rep.log) ferro2 $(awk '/^ +8 /{print $6}' $R/ferro-np2-$rep.log) ferro4 $(awk '/^ +8 /{print $6}' $R/ferro-np4-$rep.log)"
done
el done
cd $OUT && tar czf r.tgz r && rm -rf r
