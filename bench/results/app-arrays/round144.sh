#!/usr/bin/env bash
# Round 144 (device machine, 16-core host; 2026-12-07): round 143's mixed cells again, three
# alternations: 2-rank all-reduce 256 KiB-2 MiB (default against slots), 16-rank all-gather
# 256-512 KiB, 2-rank broadcast 1-4 MiB; application-sized arrays as in round143.sh.
# Build and carry as round143.sh.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/fb-base
it() { case $1 in 4M|8M) echo "-n 20 -w 3";; 1M|2M) echo "-n 40 -w 5";; *) echo "-n 100 -w 10";; esac; }
line() {  # label np coll size program and its arguments
  local l=$1 np=$2 c=$3 s=$4; shift 4
  printf "%-6s np%-2s %-14s %-5s " $l $np $c $s
  timeout 40 mpirun -np $np --bind-to none "$@" -b $s -e $s $(it $s) 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s %s", $6, $10} /[Ee]rror|failed|panick/{print}'
  echo
}
cell() { # np coll size, default and slots alternated by $i, Open MPI on the first pass
  if [ $((i % 2)) = 1 ]; then line def $1 $2 $3 $B $2; line slots $1 $2 $3 -x FERROCCL_NODE_STAGE_MAX=1G $B $2
  else line slots $1 $2 $3 -x FERROCCL_NODE_STAGE_MAX=1G $B $2; line def $1 $2 $3 $B $2; fi
  [ $i -le 2 ] && line ompi $1 $2 $3 /tmp/ompi_bench -C $2
}
for i in 1 2 3; do
  before 500 || break
  for s in 256K 512K 1M 2M; do cell 2 all_reduce $s; done
  for s in 128K 256K 512K; do cell 16 all_gather $s; done
  for s in 1M 2M 4M; do cell 2 broadcast $s; done
done 2>&1 | tee $R/cells.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
