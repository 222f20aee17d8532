#!/usr/bin/env bash
# Round 70 (16-core host; issue 15): whole malloc'd all-reduces built from kernel copies or
# shared-memory slots (bench/cma_probe.c, ar_* steps), bound to cores and not; ferroccl-bench's
# all-reduce with and without binding, malloc'd and ncclMemAlloc buffers.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mpicc -O3 -march=native bench/cma_probe.c -o /tmp/cma_probe || exit 1
for bind in none core; do for np in 8 16; do for sz in 1048576 2097152 4194304 8388608; do
  echo "== bind $bind" >> $R/probe.txt
  timeout 60 mpirun -np $np --bind-to $bind /tmp/cma_probe $sz 262144 20 >> $R/probe.txt 2>&1
done; done; done
grep -E "==|ranks|private|ar_" $R/probe.txt; el probe
B=$PWD/.dev/bin/ferroccl-bench
for np in 8 16; do for bind in none core; do for A in "" "--alloc nccl"; do for rep in 1 2; do
  echo "== np $np bind $bind alloc '$A' rep $rep" >> $R/bench.txt
  timeout 90 mpirun -np $np --bind-to $bind -x NCCL_SOCKET_IFNAME=lo $B all_reduce -b 1M -e 8M -f 2 -n 20 -w 5 $A 2>&1 | grep -E "^ +[0-9]+ " >> $R/bench.txt
done; done; done; done
cat $R/bench.txt; el bench
cd $OUT && tar czf r.tgz r && rm -rf r
