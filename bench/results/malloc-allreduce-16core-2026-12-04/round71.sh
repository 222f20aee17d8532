#!/usr/bin/env bash
# Round 71 (16-core host; issue 15): do transparent huge pages under malloc'd buffers
# (glibc's own tunable, GLIBC_TUNABLES=glibc.malloc.hugetlb=1: malloc advises THP for its
# mmapped chunks) make the kernel copies of a malloc'd all-reduce cheaper? Probe and
# ferroccl-bench, alternating off/on.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
ldd --version | head -1 > $R/glibc.txt; grep -i huge /proc/meminfo >> $R/glibc.txt; cat $R/glibc.txt
mpicc -O3 -march=native bench/cma_probe.c -o /tmp/cma_probe || exit 1
for np in 8 16; do for sz in 2097152 8388608; do for rep in 1 2; do for thp in 0 1; do
  echo "== thp $thp rep $rep" >> $R/probe.txt
  timeout 60 mpirun -np $np --bind-to none -x GLIBC_TUNABLES=glibc.malloc.hugetlb=$thp /tmp/cma_probe $sz 262144 20 >> $R/probe.txt 2>&1
done; done; done; done
grep -E "==|ranks|private|cma_|ar_" $R/probe.txt; el probe
B=$PWD/.dev/bin/ferroccl-bench
for np in 8 16; do for rep in 1 2; do for thp in 0 1; do
  echo "== np $np thp $thp rep $rep" >> $R/bench.txt
  timeout 90 mpirun -np $np --bind-to none -x NCCL_SOCKET_IFNAME=lo -x GLIBC_TUNABLES=glibc.malloc.hugetlb=$thp $B all_reduce -b 1M -e 32M -f 2 -n 20 -w 5 2>&1 | grep -E "^ +[0-9]+ " >> $R/bench.txt
  grep AnonHugePages /proc/meminfo >> $R/bench.txt
done; done; done
cat $R/bench.txt; el bench
cd $OUT && tar czf r.tgz r && rm -rf r
