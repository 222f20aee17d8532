#!/usr/bin/env bash
# Round 69 (16-core host of the H200 machine; issue 15): where a malloc'd all-reduce of
# 1-8 MiB at 8 and 16 ranks spends its time. bench/cma_probe.c times the building blocks
# (kernel copies from/to peers, plain copies through shared memory) with every rank at once;
# ferroccl-bench all_reduce with slots only, kernel copies only, the default, and ncclMemAlloc.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
which perf > $R/tools.txt 2>&1; cat /proc/sys/kernel/yama/ptrace_scope >> $R/tools.txt 2>&1; cat /sys/kernel/mm/transparent_hugepage/enabled >> $R/tools.txt; lscpu >> $R/tools.txt
mpicc -O3 -march=native bench/cma_probe.c -o /tmp/cma_probe || exit 1
for np in 8 16; do for sz in 1048576 2097152 8388608; do for pc in 262144 65536; do
  timeout 60 mpirun -np $np --bind-to core /tmp/cma_probe $sz $pc 20 >> $R/probe.txt 2>&1
done; done; done
cat $R/probe.txt; el probe
B=$PWD/.dev/bin/ferroccl-bench
for np in 8 16; do
  for v in default cma slots nccl; do
    case $v in default) X=""; A="";; cma) X="-x FERROCCL_NODE_STAGE_MAX=0"; A="";; slots) X="-x FERROCCL_NODE_STAGE_MAX=1073741824"; A="";; nccl) X=""; A="--alloc nccl";; esac
    for rep in 1 2; do
      echo "== np $np $v rep $rep" >> $R/bench.txt
      timeout 90 mpirun -np $np --bind-to none -x NCCL_SOCKET_IFNAME=lo $X $B all_reduce -b 1M -e 8M -f 2 -n 20 -w 5 $A 2>&1 | grep -E "^ +[0-9]+ " >> $R/bench.txt
    done
  done
done
cat $R/bench.txt; el bench
cd $OUT && tar czf r.tgz r && rm -rf r
