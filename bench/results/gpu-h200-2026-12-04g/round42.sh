#!/usr/bin/env bash
# Round 42: (1) fan-out kernel variants (one read, P writes) against copy and memset: is the
# one-GPU all-gather/broadcast at 8 ranks limited by its kernel? (2) the staged path's 1-2 MiB
# stalls: with and without the cache eviction of staged_bw, with blocking sync, with steal time
# (vmstat) and each thread's CPU affinity recorded.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN bench/gpu/fanout_bw.cu -o $BUILD/fanout_bw > $R/fanout_build.txt 2>&1; echo "fanout_bw build rc=$?"; head -5 $R/fanout_build.txt
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
$BUILD/fanout_bw 8 32 128 256 1024 > $R/fanout-p8.txt 2>&1; cat $R/fanout-p8.txt
$BUILD/fanout_bw 4 64 256 > $R/fanout-p4.txt 2>&1; cat $R/fanout-p4.txt
el "fanout"
vmstat -t 1 > $R/vmstat.txt 2>&1 &
VM=$!
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1; shift
  ( sleep 4; for p in $(pgrep -f "$BUILD/staged_bw" | head -4); do echo "pid $p: $(grep -h Cpus_allowed_list /proc/$p/task/*/status 2>/dev/null | sort | uniq -c | tr '\n' ' ')"; done > $R/affinity-$l.txt ) &
  timeout 120 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x STAGED_BW_EVICT_MIB -x STAGED_BW_BLOCKING_SYNC $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$? $(date +%T)"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | tail -5; cat $R/affinity-$l.txt; }
unset STAGED_BW_BLOCKING_SYNC
for rep in 1 2; do
  export STAGED_BW_EVICT_MIB=512; st evict-$rep 1 16
  export STAGED_BW_EVICT_MIB=1; st noevict-$rep 1 16
done
export STAGED_BW_EVICT_MIB=1 STAGED_BW_BLOCKING_SYNC=1; st noevict-blocking 1 16
kill $VM
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
