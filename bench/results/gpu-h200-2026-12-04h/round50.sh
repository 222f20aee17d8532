#!/usr/bin/env bash
# Round 50: the staged path's millisecond stalls as ksoftirqd starved by spinning threads?
# Loopback TCP delivers through softirqs of the sending CPU, deferred to ksoftirqd under load;
# a thread spinning there keeps ksoftirqd off the CPU until preempted. The new build yields
# every 64 idle rounds while transfers are posted. staged_bw 1-16 MiB, old (.dev/prefix-old,
# c1c4ebd) against new, alternating, with the ksoftirqd CPU time and NET_RX softirq counts of
# each run; then TLS once each.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; OLD=$PWD/.dev/prefix-old; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
cat /sys/kernel/debug/sched/features > $R/sched-features.txt 2>&1 || true; uname -r
ks() { local t=0; for p in $(pgrep ksoftirqd); do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo "$t $(awk '/NET_RX/ {s=0; for (i=2;i<=NF;i++) s+=$i; print s}' /proc/softirqs)"; }
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1 lib=$2; shift 2
  local a=($(ks))
  timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$lib $SOCK -x FERROCCL_BENCH_PSK $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  local rc=$? b=($(ks))
  echo "== staged $l rc=$rc ksoftirqd ticks +$((b[0]-a[0])) NET_RX +$((b[1]-a[1]))"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | grep -v "^#  " | tail -6; }
unset FERROCCL_BENCH_PSK
for rep in 1 2 3; do
  st old-$rep $OLD/lib 1 16
  st new-$rep $PFX/lib 1 16
done
el "plaintext"
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round50
st tls-old $OLD/lib 1 16
st tls-new $PFX/lib 1 16
el "tls"
cd $OUT && tar czf r.tgz r && rm -rf r
