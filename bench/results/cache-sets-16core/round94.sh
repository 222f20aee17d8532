#!/usr/bin/env bash
# Round 94 (16-core host of the device machine, 2026-12-05 evening). Carry .dev: build at
# b915325 (bin/, prefix/, it), exp/fb-f9acf7c (small ring rows of exactly 64 granules),
# exp/fb-before (d23f369, no small ring), exp/fb-skew (b915325 with each rank's data slots
# 8256 B further on: rank * 8256, so that 16 ranks' blocks at one offset of their slots fall
# in different cache sets).
#  1. GPU tests on this build; gpu_processes_abort_device_send 12 more times with P2P logging
#     (it failed once in round 93: rank 0's held send finished while rank 1's stream was held).
#  2. Small sizes, HEAD against both older layouts, 3 alternating launches.
#  3. Data slot skew against HEAD: reduce-scatter and all-reduce 32 KiB-2 MiB, 8 and 16 ranks.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; lscpu | grep -i cache; uptime; } > $R/host.txt
export FERROCCL_TIMEOUT=30
timeout 200 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10; el "gpu tests"
fails=0
for i in $(seq 12); do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=P2P,INIT timeout 60 .dev/it --exact cuda::gpu_processes_abort_device_send --test-threads 1 > $R/abort-$i.txt 2>&1 || { fails=$((fails+1)); echo "abort run $i failed"; }
done
echo "abort_device_send: $fails of 12 failed"; grep -h "staged\|cannot be shared\|P2P/" $R/abort-*.txt | sort | uniq -c | head; el "abort loop"
run() { timeout 60 mpirun -np $NP --bind-to none -x NCCL_SOCKET_IFNAME=lo "$@" 2>&1 | grep -E "^ +[0-9]" | awk -v lo=$LO -v hi=$HI '$1>=lo && $1<=hi {printf "%s %s/%s/w%s%s  ", $1, $6, $10, $9, $13}'; echo; }
LO=8 HI=32768
for rep in 1 2 3; do for NP in 16 8; do for v in head f9acf7c before; do
  B=.dev/bin/ferroccl-bench; [ $v != head ] && B=.dev/exp/fb-$v
  CS="all_gather all_reduce reduce_scatter broadcast"; [ $NP = 8 ] && CS="all_gather all_reduce"
  for c in $CS; do printf "%s np$NP %s rep$rep " $c $v; run $B $c -b 8 -e 32K -f 4 -n 200 -w 20 -c 1; done
done; done; done > $R/small.txt 2>&1
el "small"
LO=32768 HI=2097152
for rep in 1 2 3; do for NP in 16 8; do for v in head skew; do for c in reduce_scatter all_reduce; do
  B=.dev/bin/ferroccl-bench; [ $v != head ] && B=.dev/exp/fb-$v
  printf "%s np$NP %s rep$rep " $c $v; run $B $c -b 32K -e 2M -f 2 -n 100 -w 10 -c 1
done; done; done; done > $R/skew.txt 2>&1
cat $R/skew.txt; el "skew"
cd $OUT && tar czf r.tgz r && rm -rf r
