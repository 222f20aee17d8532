#!/usr/bin/env bash
# Round 153 (device machine, 2026-12-07): round 151 found the hand-off floor of two processes on
# one GPU (no MPS) at 267 us for 8 B but 22 us for 4 KiB, and ferroccl's staged all-reduce at
# 224-304 us up to 1 KiB and 52-54 us from 2 KiB. Which copy is slow, from which size, and does
# cuMemcpyBatchAsync with the prefer-overlap-with-compute hint (a copy engine) avoid it?
set -u
R=$OUT/r; mkdir -p $R; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi
nvcc -O2 -I$MPI_HOME/include bench/gpu/handoff_floor.cu -lcuda -L$MPI_HOME/lib -lmpi -o /tmp/hf > $R/build.log 2>&1 || { cat $R/build.log; exit 1; }
for np in 2 1; do for mode in 0 1 2 3; do for b in 8 512 1024 1536 2048 4096; do
  [ $np = 1 ] && [ $mode -gt 1 ] && continue
  r=$(timeout 20 mpirun -np $np --bind-to none /tmp/hf $b 200 $mode 2>&1 | tail -1 | sed 's/.*process://')
  echo "np$np mode$mode $b B:$r" | tee -a $R/floor.txt
done; done; done
