#!/usr/bin/env bash
# Round 104 (device machine, 2026-12-06): the floor of a stream of broadcasts at 8 and 16 ranks
# (bench/fanout_floor.c: one writer, 7 or 15 readers, plain shared memory), fresh data against
# data that stays in the readers' caches; then ferroccl against Open MPI, broadcast only, at
# 16 and 8 ranks, both buffer kinds, three repeats. Carry .dev (built at .dev/build.commit).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; } > $R/host.txt 2>&1
gcc -O2 bench/fanout_floor.c -o /tmp/fanout_floor || exit 1
for i in 1 2 3; do for rd in 15 7; do for b in 32768 131072 524288; do for m in fresh stagger reuse; do
  /tmp/fanout_floor $rd $b $(( 2000 * 524288 / b )) $m
done; done; done; done > $R/floor.txt 2>&1
sort $R/floor.txt | awk '{k=$1" "$3" "$5; if(!(k in best)||$6<best[k])best[k]=$6} END{for(k in best)print k, best[k]}' | sort -k2,2n -k3,3n -k1,1
el floor
B=$PWD/.dev/bin/ferroccl-bench
for np in 16 8; do
  left=$(( ${LIMIT:-560} - ($(date +%s) - T0) ))
  [ $left -lt 90 ] && { el "skip np$np: $left s left"; continue; }
  TMPDIR=$R/tmp timeout $left bench/compare_ompi.sh -np $np --colls broadcast --sizes 8:128M --factor 4 --repeat 3 --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 300 --out $R/np$np > $R/np$np.txt 2>&1
  rc=$?; el "compare np$np rc=$rc"
  if [ ! -f $R/np$np.md ] && [ -d $R/np$np-logs ]; then
    bench/compare_ompi.sh -np $np --colls broadcast --both-allocs --report-from $R/np$np-logs --out $R/np$np > /dev/null 2>&1; el "np$np reported from logs"
  fi
  sed -n '/^| size/,/^$/p' $R/np$np.md 2>/dev/null
  rm -rf $R/np$np-logs
done
rm -rf $R/tmp; el done
