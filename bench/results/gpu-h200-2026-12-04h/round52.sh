#!/usr/bin/env bash
# Round 52 (build aac2204): (1) the fan-out through each SM's bulk-copy unit (TMA): one thread
# per block loads a tile into shared memory and bulk-stores it to every destination, next to
# the SM-store kernels, with Nsight Compute DRAM counters; (2) TRACE of staged jobs at 1-2 MiB
# with the CPU of every send, receive and sleep, to catch a remaining stall.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1 &
nvcc -O2 $GEN bench/gpu/fanout_bw.cu -o $BUILD/fanout_bw > $R/fanout_build.txt 2>&1; echo "fanout_bw build rc=$?"; head -20 $R/fanout_build.txt
wait
for rep in 1 2; do timeout 60 $BUILD/fanout_bw 8 256 1024 > $R/fanout-p8-$rep.txt 2>&1; echo "rc=$?"; cat $R/fanout-p8-$rep.txt; done
timeout 60 $BUILD/fanout_bw 4 256 > $R/fanout-p4.txt 2>&1; cat $R/fanout-p4.txt
for skip in 3 16; do
  timeout 60 ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum -k regex:fanout_tma --launch-skip $skip -c 1 $BUILD/fanout_bw 8 256 > $R/ncu-tma-$skip.txt 2>&1; echo "ncu rc=$?"
  grep -E "fanout|dram__|gpu__time|Error|ERR" $R/ncu-tma-$skip.txt | head -6
done
el "fanout"
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
for rep in 1 2 3; do
  NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=$R/trace-$rep.%h.%p timeout 60 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw 1 2 > $R/staged-trace-$rep.txt 2>&1
  echo "== trace $rep rc=$?"; grep -v "^\[" $R/staged-trace-$rep.txt | grep -v NCCL | grep -v "^#  " | tail -3
done
el "trace"
cd $OUT && tar czf r.tgz r && rm -rf r
