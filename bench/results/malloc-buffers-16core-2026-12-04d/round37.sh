#!/usr/bin/env bash
# Final round of the session: GPU tests on the final tree, then issue 15 on the 16-core host
# against Open MPI (malloc'd buffers), 4 ranks first (never measured here), then 2, 8, 16;
# each rank count its own run under one overall time budget.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( $1 - ($(date +%s) - T0) )); }
( LD_LIBRARY_PATH=$PWD/.dev/prefix/lib timeout 90 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "test result|FAILED" $R/it-cuda.txt
el "it"
B=$PWD/.dev/bin/ferroccl-bench
# 2-rank reduce-scatter, 256 B-128 KiB (0.92x at 512 B and 0.82x at 32 KiB last time): the
# default against kernel copies (FERROCCL_NODE_STAGE_MAX=0), alternating, out of place.
for rep in 1 2; do
  for v in default stage0; do
    env=""; [ $v = stage0 ] && env="-x FERROCCL_NODE_STAGE_MAX=0"
    timeout 40 mpirun -np 2 --bind-to none $env $B reduce_scatter -b 256 -e 128K -f 2 -n 2000 -w 200 -c 1 > $R/rs-$v-$rep.txt 2>&1
    echo "rs $v $rep rc=$? $(awk '$1 ~ /^[0-9]+$/ {printf "%s:%s ", $1, $6}' $R/rs-$v-$rep.txt)"
  done
done
el "rs sweep"
cmp() { # label budget args
  local l=$1 b=$2; shift 2
  local t=$(left $b); [ $t -lt 30 ] && { echo "skip $l (no time)"; return; }
  timeout $t bench/compare_ompi.sh "$@" --no-build --ferroccl-bench $B --out $R/$l > $R/$l.log 2>&1
  echo "== $l rc=$?"; grep -E "PASS|MISS" $R/$l.log | head -12
  el "$l"
}
cmp np4-malloc 330 -np 4 --sizes 8:128M --factor 4
cmp np2-malloc 330 -np 2 --sizes 8:128M --factor 4
cmp np8-malloc 330 -np 8 --sizes 8:128M --factor 4
cmp np16-malloc 330 -np 16 --sizes 8:128M --factor 4
cd $OUT && tar czf r.tgz r && rm -rf r
