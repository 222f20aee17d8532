#!/usr/bin/env bash
# Round 93 (16-core host of the device machine; run 2026-12-05 evening session). Needs in .dev: the
# build at HEAD (bin/ferroccl-bench, prefix/, it) and exp/fb-before = ferroccl-bench built at
# d23f369 (before the small ring slots): `git worktree add /tmp/wt d23f369 && cd /tmp/wt &&
# cargo build --release -p ferroccl-bench`, then copy and strip it.
#  1. Round 81's GPU checks on this build.
#  2. The small ring slots on 16 cores: before/after, 8 and 16 ranks, 8 B-8 KiB in one sweep to
#     128 MiB (as compare_ompi.sh runs it), all-reduce, reduce-scatter, broadcast, all-gather,
#     3 alternating launches.
#  3. The 8-rank all-gather's slots (today's rule) against kernel copies at 512 KiB-32 MiB
#     (round 92: 2 MiB 0.78x Open MPI through slots), 3 alternating launches, in a 128 MiB sweep.
#  4. warm_inputs before the direct all-reduce's combine of inputs 0 and 1 (.dev/exp/fb-warmfirst,
#     built from HEAD with warm_inputs moved above the combine in reduce_round) against HEAD,
#     8 and 16 ranks, 8-128 KiB, 3 alternating launches.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; } > $R/host.txt
mkdir -p $OUT/g; OUT=$OUT/g bash bench/results/gpu-thread-p2p/round81.sh > $R/round81.txt 2>&1
cat $R/round81.txt; el "round 81"
run() { timeout 120 mpirun -np $NP --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_NODE_STAGE_MAX "$@" 2>&1 | grep -E "^ +[0-9]" | awk -v lo=$LO -v hi=$HI '$1>=lo && $1<=hi {printf "%s %s/%s/w%s%s  ", $1, $6, $10, $9, $13}'; echo; }
LO=8 HI=8192
for NP in 16 8; do for rep in 1 2 3; do for v in before after; do for c in all_reduce reduce_scatter broadcast all_gather; do
  B=.dev/bin/ferroccl-bench; [ $v = before ] && B=.dev/exp/fb-before
  printf "%s np$NP %s rep$rep " $c $v; run $B $c -b 8 -e 128M -f 4 -n 100 -w 10 --tier 1M:20:5 --tier 64M:5:2 -c 1
done; done; done; done > $R/small-ring.txt 2>&1
el "small ring"
LO=524288 HI=33554432 NP=8
for rep in 1 2 3; do for sm in 1T 0; do
  printf "all_gather np8 stage$sm rep$rep "; FERROCCL_NODE_STAGE_MAX=$sm run .dev/bin/ferroccl-bench all_gather -b 8 -e 128M -f 4 -n 100 -w 10 --tier 1M:20:5 --tier 64M:5:2 -c 1
done; done > $R/ag8.txt 2>&1
cat $R/ag8.txt; el "ag8"
LO=8192 HI=131072
for NP in 16 8; do for rep in 1 2 3; do for v in after warmfirst; do
  B=.dev/bin/ferroccl-bench; [ $v = warmfirst ] && B=.dev/exp/fb-warmfirst
  printf "all_reduce np$NP %s rep$rep " $v; run $B all_reduce -b 8K -e 128K -f 2 -n 200 -w 20 -c 1
done; done; done > $R/warmfirst.txt 2>&1
cat $R/warmfirst.txt; el "warm first"
# 5. Issue 14: the staged path (device buffers over loopback sockets, 2 ranks sharing the GPU)
#    with the kernel's TCP counters around each run: is every stall a retransmission?
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
mkdir -p $BUILD
if [ $(( $(date +%s) - T0 )) -lt 470 ]; then
  nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1
  snap() { awk '/^TcpExt:/ {if (!h) {split($0, k); h=1} else {for (i=2;i<=NF;i++) print k[i], $i}}' /proc/net/netstat; awk '/^Tcp:/ {if (!h) {split($0, k); h=1} else {for (i=2;i<=NF;i++) print "Tcp" k[i], $i}}' /proc/net/snmp; }
  for pass in 1 2 3; do
    snap | sort > $BUILD/n0
    timeout 60 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo $BUILD/staged_bw 2 16 > $R/staged-$pass.txt 2>&1
    rc=$?; snap | sort > $BUILD/n1
    echo "== staged pass $pass rc=$rc $(join $BUILD/n0 $BUILD/n1 | awk '$1 ~ /OFOQueue|RetransSegs|TCPTimeouts|TCPLossProbes|TCPFastRetrans|TCPSACKReorder|TCPDSACKRecv|TCPSpuriousRTOs/ {printf "%s +%d ", $1, $3-$2}')" | tee -a $R/staged-tcp.txt
    grep -E "^ +[0-9]" $R/staged-$pass.txt
  done
  el "staged"
fi
cd $OUT && tar czf r.tgz r && rm -rf r
