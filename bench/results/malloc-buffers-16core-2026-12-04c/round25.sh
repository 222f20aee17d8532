#!/usr/bin/env bash
# Final round: GPU tests on the merged tree, then issue 15 on the 16-core host against Open MPI
# (malloc'd buffers; ncclMemAlloc at 2 ranks), each rank count its own run so that a late one
# cannot lose the earlier ones.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_SOCKET_IFNAME=lo
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( $1 - ($(date +%s) - T0) )); }
( LD_LIBRARY_PATH=$PWD/.dev/prefix/lib timeout 60 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "test result|FAILED" $R/it-cuda.txt
el "it"
B=$PWD/.dev/bin/ferroccl-bench
cmp() { # label budget args
  local l=$1 b=$2; shift 2
  local t=$(left $b); [ $t -lt 20 ] && { echo "skip $l (no time)"; return; }
  timeout $t bench/compare_ompi.sh "$@" --no-build --ferroccl-bench $B --out $R/$l > $R/$l.log 2>&1
  echo "== $l rc=$?"; grep -E "PASS|MISS|below" $R/$l.log | head -12
  el "$l"
}
cmp np2-malloc 300 -np 2 --sizes 8:128M --factor 4
cmp np16-malloc 300 -np 16 --sizes 8:128M --factor 4
cmp np8-malloc 300 -np 8 --sizes 8:128M --factor 4
cmp np2-memalloc 300 -np 2 --sizes 8:128M --factor 4 --mem-alloc
cmp np4-malloc 300 -np 4 --sizes 8:128M --factor 4
cd $OUT && tar czf r.tgz r && rm -rf r
