#!/usr/bin/env bash
# Round 122 (device machine, 2026-12-06): round 121's 64 MiB all-gather through the staged
# path ran slower with 5d16201 than with 6356605 in both pairs (13.6-13.9 ms against
# 10.6-12.4). Three more alternating pairs at 32-128 MiB (all-reduce at 64-128 MiB, staged as
# separate operations and untouched by the change, as a control of the machine's drift), and
# one TRACE run of the new build's all-gather at 64 MiB for its timeline.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
OUT=$R/nt timeout 200 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests build-only > $R/nccl-tests-build.txt 2>&1
el "build"
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
NT=/tmp/nccl-tests-build/ferroccl
for i in 1 2 3; do for t in all_gather all_reduce; do for b in prev new; do
  pfx=$PWD/.dev/prefix; [ $b = prev ] && pfx=$PWD/.dev/prefix-prev
  timeout 90 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$pfx/lib $SOCK \
    $NT/${t}_perf -b 32M -e 128M -f 2 -c 1 -n 6 -w 2 > $R/nt-$t-$b-$i.txt 2>&1
  printf "%-11s %-4s %s rc=%s %s | " $t $b $i $? "$(grep -E 'Out of bounds' $R/nt-$t-$b-$i.txt | awk '{print $NF, $(NF-1)}')"
  grep -E "^ +[0-9]+ " $R/nt-$t-$b-$i.txt | awk '{printf "%s:%s ", $1, $6}'; echo
done; done; done
el "ab"
NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=$R/trace.%h.%p timeout 60 mpirun -np 2 --bind-to none \
  -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE \
  $NT/all_gather_perf -b 64M -e 64M -c 1 -n 3 -w 1 > $R/nt-trace.txt 2>&1
el "trace rc=$?"; grep -E "^ +[0-9]+ " $R/nt-trace.txt
cd $OUT && tar czf r.tgz r && rm -rf r
