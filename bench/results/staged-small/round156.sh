#!/usr/bin/env bash
# Round 156 (device machine, 2026-12-08): round 154's staged_threads comparison again, alone
# (round 154 ran it beside an nccl-tests build): device buffers over the staged path (sockets)
# against host buffers over the same sockets, 2 ranks as 2 processes (two CUDA contexts) and as
# 2 threads of one process (one context), alternating twice.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; P=$PWD/.dev/prefix
{ cat .dev/build.commit; nvidia-smi -L; uptime; date -u; } > $R/host.txt 2>&1; cat $R/host.txt
nvcc -O2 -I$P/include -I$MPI_HOME/include bench/gpu/staged_threads.cu -L$P/lib -lnccl -L$MPI_HOME/lib -lmpi -Xlinker -rpath,$P/lib -o /tmp/st > $R/build.log 2>&1 || { cat $R/build.log; exit 1; }
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
for rep in 1 2; do
  timeout 60 mpirun -np 2 --bind-to none $SOCK /tmp/st 1 $((32<<20)) > $R/procs-$rep.txt 2>&1; echo "[$(( $(date +%s) - T0 ))s] procs $rep rc=$?"; grep -v "^#\|NCCL INFO" $R/procs-$rep.txt | tr '\n' ';'; echo
  timeout 60 mpirun -np 1 --bind-to none $SOCK /tmp/st 2 $((32<<20)) > $R/threads-$rep.txt 2>&1; echo "[$(( $(date +%s) - T0 ))s] threads $rep rc=$?"; grep -v "^#\|NCCL INFO" $R/threads-$rep.txt | tr '\n' ';'; echo
done
cd $OUT && tar czf r.tgz r && rm -rf r
