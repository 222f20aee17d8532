#!/usr/bin/env bash
# Round 108 (device machine, 2026-12-06): the staggered kernel copies in the library. 16 ranks,
# broadcast of 8 MiB in an 8 MiB malloc'd array (default rule: kernel copies from 4 MiB) against
# Open MPI and the slots, three alternations; then ferroccl against Open MPI, broadcast, 16
# ranks, both buffer kinds, three repeats. Carry .dev.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench_r108 bench/ompi_bench.c || exit 1
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label np size max then mpirun args
  local l=$1 np=$2 s=$3 e=$4; shift 4
  printf "%-9s np%-2s buf %-4s " $l $np $e
  timeout 60 mpirun -np $np --bind-to none "$@" -b $s -e $e -f 4 -n 20 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed|panick/{print}'
  echo
}
for i in 1 2 3; do
  line default 16 8M 8M $B broadcast
  line slots 16 8M 8M -x FERROCCL_NODE_STAGE_MAX=16M $B broadcast
  line ompi 16 8M 8M /tmp/ompi_bench_r108 -C broadcast
  line default 16 8M 32M $B broadcast
done > $R/kc.txt 2>&1
cat $R/kc.txt; el kc
TMPDIR=$R/tmp timeout 400 bench/compare_ompi.sh -np 16 --colls broadcast --sizes 8:128M --factor 4 --repeat 3 --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 300 --out $R/np16 > $R/np16.txt 2>&1
el "compare rc=$?"
sed -n '/^| size/,/^$/p' $R/np16.md 2>/dev/null
rm -rf $R/np16-logs $R/tmp; el done
