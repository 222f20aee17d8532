#!/usr/bin/env bash
# Round 63 (the H200 machine's 16 cores, host buffers from malloc; issue 15): the small-call
# path after the call-shape memo against Open MPI (2 and 4 ranks, 8 B-16 KiB, all_reduce and
# broadcast, best of 3), 8 and 16 ranks across 8 B-128 MiB (all four collectives, one pass);
# then issue 14's staged path (device buffers over loopback TCP) with the kernel's TCP
# counters around each run: are the stalls retransmissions?
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket" > $R/cpu.txt; cat $R/cpu.txt
cmp() { local l=$1; shift
  timeout 280 bench/compare_ompi.sh "$@" --no-build --ferroccl-bench $PWD/.dev/bin/ferroccl-bench --timeout 120 --out $R/$l > $R/$l.txt 2>&1; echo "compare $l rc=$?"; }
cmp small -np 2,4 --sizes 8:16K --factor 2 --repeat 3 --colls all_reduce,broadcast
grep -A30 "^| ranks | collective" $R/small.md | head -40
el "small"
cmp np8-16 -np 8,16 --sizes 8:128M --factor 4 --repeat 1
grep -A60 "^| ranks | collective" $R/np8-16.md | head -70
el "8/16"
snap() { awk '/^TcpExt:/ {if (!h) {split($0, k); h=1} else {for (i=2;i<=NF;i++) print k[i], $i}}' /proc/net/netstat; awk '/^Tcp:/ {if (!t) {split($0, k); t=1} else {for (i=2;i<=NF;i++) print k[i], $i}}' /proc/net/snmp; }
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
for rep in 1 2 3; do
  snap > $BUILD/n0
  timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK $BUILD/staged_bw 1 16 > $R/staged-$rep.txt 2>&1
  rc=$?; snap > $BUILD/n1
  echo "== staged $rep rc=$rc $(join $BUILD/n0 $BUILD/n1 | awk '$1 ~ /OFOQueue|RetransSegs|LossProbes|FastRetrans|InSegs|TCPTimeouts|DelayedACKs/ {printf "%s +%d ", $1, $3-$2}')"
  grep -v "^\[" $R/staged-$rep.txt | grep -v NCCL | grep -v "^#  " | tail -6
done
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
