#!/usr/bin/env bash
# Round 14 (issue 15): ordinary (malloc'd) buffers on the 16-core host.
# A: slots against kernel copies (FERROCCL_NODE_STAGE_MAX=0) and slot sizes, ferroccl only.
# B: compare_ompi.sh with malloc'd buffers, and with ncclMemAlloc buffers, at 2, 4, 8, 16 ranks.
set -u
R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_SOCKET_IFNAME=lo
B=$PWD/.dev/bin/ferroccl-bench-new
{
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(date -u +%FT%TZ)"
lscpu | grep -E "L1d|L2|L3|NUMA node\(s\)|Socket"
for np in 2 8 16; do
  for coll in all_reduce reduce_scatter all_gather; do
    for mode in cma slot256K slot1M; do
      case $mode in
        cma) envs="FERROCCL_NODE_STAGE_MAX=0" ;;
        slot256K) envs="FERROCCL_NODE_SLOT_SIZE=256K" ;;
        slot1M) envs="FERROCCL_NODE_SLOT_SIZE=1M" ;;
      esac
      echo "== np $np $coll $mode"
      env $envs timeout 60 mpirun -np $np --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo $B $coll -b 16K -e 64M -f 4 -n 10 -w 3 -c 0 --host-alloc 2>&1 | grep -E "^ +[0-9]+ " | awk '{printf "%s:%s ", $1, $6} END {print ""}'
    done
  done
done
} 2>&1 | tee $R/crossover.txt
s=$SECONDS
timeout 270 bash bench/compare_ompi.sh -np 2,4,8,16 --sizes 8:128M --factor 4 --host-alloc --ferroccl-bench $B --no-build --out $R/ompi-compare-16core-hostalloc > $R/cmp-host.log 2>&1
echo "compare host-alloc rc=$? $((SECONDS-s)) s"
grep -A20 "## Targets" $R/ompi-compare-16core-hostalloc.md | head -30
cd $OUT && tar czf r.tgz r && rm -rf r
