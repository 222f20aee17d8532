#!/usr/bin/env bash
# Final round: GPU tests on the merged tree, then issue 15 on the 16-core host: malloc'd buffers
# with FERROCCL_SHARE_HEAP=1 next to ncclMemAlloc ones, and the Open MPI comparison with
# malloc'd buffers (default settings).
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_SOCKET_IFNAME=lo
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LD_LIBRARY_PATH=$PWD/.dev/prefix/lib
( timeout 120 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "^test |test result" $R/it-cuda.txt
unset LD_LIBRARY_PATH
el "it"
B=$PWD/.dev/bin/ferroccl-bench
sh_run() { # label np coll env args
  local l=$1 np=$2 c=$3 e=$4; shift 4
  timeout 60 mpirun -np $np --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo $e $B $c "$@" > $R/sh-$l.txt 2>&1
  echo "$l rc=$? $(grep -E '^ +[0-9]+ ' $R/sh-$l.txt | tail -6 | awk '{printf "%s:%s ", $1, $6}')"
}
for np in 2 8 16; do
  for c in all_reduce all_gather; do
    sh_run np$np-$c-off $np $c "-x FERROCCL_SHARE_HEAP=0" -b 1M -e 64M -f 4 -n 10 -w 3 -c 0 -N 2 --host-alloc
    sh_run np$np-$c-on $np $c "-x FERROCCL_SHARE_HEAP=1" -b 1M -e 64M -f 4 -n 10 -w 3 -c 0 -N 2 --host-alloc
    sh_run np$np-$c-mem $np $c "" -b 1M -e 64M -f 4 -n 10 -w 3 -c 0 -N 2
  done
done
sh_run np8-check-on 8 all_reduce "-x FERROCCL_SHARE_HEAP=1" -b 1M -e 16M -f 4 -n 2 -w 1 -c 1 --host-alloc
el "share heap"
timeout 330 bench/compare_ompi.sh -np 2,4,8,16 --sizes 8:128M --factor 4 --host-alloc --no-build \
  --ferroccl-bench $B --out $R/ompi-compare-16core-2026-12-04b-hostalloc 2>&1 | grep -E "PASS|MISS|ratio" | head -40
el "ompi compare"
cd $OUT && tar czf r.tgz r && rm -rf r
