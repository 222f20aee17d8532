#!/usr/bin/env bash
# Round 87 (16-core host of a GPU machine), READY for the next session: the build in .dev (carry
# it). Round 81's GPU checks, then issue 15's largest miss on 16 cores, the 16-rank reduce-scatter
# at 32-512 KiB (0.66x Open MPI at 128 KiB in round 85): slots, kernel copies, the ring over the
# shared-memory transport (FERROCCL_NODE_COLL=0) and ncclMemAlloc buffers side by side, 3 alternating launches, in a 512 KiB buffer (4 KiB pages), with
# `perf stat` of one launch each where perf exists. Then `NP=8 bash round84.sh` in a call of its
# own (the 8-rank comparison with Open MPI on this build).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; command -v perf; } > $R/host.txt 2>&1
cat $R/host.txt
mkdir -p $OUT/g; OUT=$OUT/g bash bench/results/gpu-thread-p2p/round81.sh > $R/round81.txt 2>&1
cat $R/round81.txt; (cd $OUT/g && tar xzf r.tgz && cp -r r/* $R/ && rm -rf $OUT/g); el "round 81"
FB=.dev/bin/ferroccl-bench
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
run() { timeout 120 mpirun -np 16 --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_NODE_STAGE_MAX -x FERROCCL_NODE_COLL "$@" 2>&1 | grep -E "^ +[0-9]" | awk '{printf "%s %s  ", $1/1024, $6}'; echo; }
for rep in 1 2 3; do
  for v in slots kernel ring memalloc ompi; do
    printf "rs np16 rep$rep %-8s " $v
    case $v in
      slots) FERROCCL_NODE_STAGE_MAX=1T run $FB reduce_scatter -b 32K -e 512K -f 2 -n 100 -w 10 -c 0 ;;
      kernel) FERROCCL_NODE_STAGE_MAX=0 run $FB reduce_scatter -b 32K -e 512K -f 2 -n 100 -w 10 -c 0 ;;
      ring) FERROCCL_NODE_COLL=0 run $FB reduce_scatter -b 32K -e 512K -f 2 -n 100 -w 10 -c 0 ;;
      memalloc) run $FB reduce_scatter -b 32K -e 512K -f 2 -n 100 -w 10 -c 0 --alloc nccl ;;
      ompi) run /tmp/ompi_bench -C reduce_scatter -b 32K -e 512K -f 2 -n 100 -w 10 -c 0 ;;
    esac
  done
done > $R/rs16.txt 2>&1
cat $R/rs16.txt; el "rs16"
if command -v perf >/dev/null; then
  for sm in 1T 0; do
    FERROCCL_NODE_STAGE_MAX=$sm timeout 120 perf stat -e task-clock,context-switches,cpu-migrations,page-faults,cycles,instructions,cache-misses -o $R/perf-rs16-$sm.txt -- mpirun -np 16 --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_NODE_STAGE_MAX $FB reduce_scatter -b 128K -e 128K -n 2000 -w 100 -c 0 > $R/perf-rs16-$sm.out 2>&1
  done; el perf
fi
cd $OUT && tar czf r.tgz r && rm -rf r
