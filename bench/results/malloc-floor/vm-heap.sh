#!/usr/bin/env bash
# AMD 2-core VM, 2026-12-07: all-reduce of application-sized arrays (-b S -e S, each size its
# own malloc'd array) at 2 and 4 ranks, four kinds of buffer alternated within each size:
#   def  - the default (slots or kernel copies, coll::node's rules)
#   heap - FERROCCL_SHARE_HEAP=1 with FERROCCL_SHARE_HEAP_MIN=128K (the opt-in that turns a
#          glibc mmapped chunk into shared memory in place; its default minimum is 1 MiB)
#   mem  - ncclMemAlloc buffers (--alloc nccl)
#   ompi - Open MPI 4.1 (ompi_bench, malloc'd)
# Usage: vm-heap.sh FERROCCL_BENCH OMPI_BENCH REPS > out.txt
set -u
B=$1 O=$2 REPS=${3:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
it() { case $1 in 4M|8M) echo "-n 40 -w 5";; 1M|2M) echo "-n 100 -w 10";; *) echo "-n 400 -w 20";; esac; }
line() { local l=$1 np=$2 s=$3; shift 3
  printf "%-5s np%s all_reduce %-5s " $l $np $s
  timeout 60 mpirun -np $np --bind-to none "$@" -b $s -e $s $(it $s) 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s %s", $6, $10} /[Ee]rror|failed|panick/{print}'
  echo; }
echo "# $(date -u) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 $REPS); do for np in 2 4; do for s in 128K 256K 512K 1M 2M 4M 8M; do
  line def $np $s $B all_reduce
  line heap $np $s -x FERROCCL_SHARE_HEAP=1 -x FERROCCL_SHARE_HEAP_MIN=128K $B all_reduce
  line mem $np $s $B all_reduce --alloc nccl
  line ompi $np $s $O -C all_reduce
done; done; echo "# rep $rep done $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg); steal: $(grep -m1 '^cpu ' /proc/stat | awk '{print $9}')"; done
