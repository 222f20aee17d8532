#!/usr/bin/env bash
# Round 119 (device machine, 2026-12-06): where a staged call's time goes when nothing stalls
# (issue 14). Round 118 found no stall worth the name (one slow first call per size, no TCP
# loss recovery, no run-queue wait) and still the device path at 0.55-0.65 of a cold host call
# at 2-8 MiB. staged_bw 2 4 with STAGED_BW_DETAIL=1 (each call's wall-clock start and end per
# rank) and NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL (the library's staged-job timeline: enqueue,
# pieces landed, sends and receives posted and completed, pieces released, worker done), once
# with the default pieces (256 KiB) and once with FERROCCL_STAGE_PIECE=4M (no overlap).
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
PFX=$PWD/.dev/prefix; MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1
el "staged_bw build rc=$?"; head -5 $R/staged_build.txt
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
for l in p256k p4m p256k-b; do
  piece=262144; [ $l = p4m ] && piece=4194304
  NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=$R/trace-$l.%h.%p FERROCCL_STAGE_PIECE=$piece \
    timeout 60 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x STAGED_BW_DETAIL=1 \
    -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE -x FERROCCL_STAGE_PIECE $BUILD/staged_bw 2 4 > $R/staged-$l.txt 2>&1
  el "staged $l rc=$?"
  grep -v "^  detail" $R/staged-$l.txt | grep -v "^\[" | tail -4
done
ls -la $R | head -20
cd $OUT && tar czf r.tgz r && rm -rf r
