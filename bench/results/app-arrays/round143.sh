#!/usr/bin/env bash
# Round 143 (device machine, 16-core host; 2026-12-07): collectives in application-sized
# arrays. Each size runs in its own malloc'd buffer of exactly that size (-b S -e S), as a
# simulation code passes its arrays: from 128 KiB to a few MiB these are glibc mmapped chunks
# on 4 KiB pages, which ferroccl never collapses into huge pages (no whole 2 MiB region of
# their own), unlike the benchmark's usual buffers sized for the largest message. Per cell:
# the default (`def`), every buffer through the slots (`slots`, FERROCCL_NODE_STAGE_MAX=1G)
# and Open MPI, reused inputs, one launch each, the order of def and slots alternated by size.
# Build: .dev/bin/fb-base from 4b84124 (cargo build --release -p ferroccl-bench, stripped);
# carry [".dev/bin", ".dev/build.commit"].
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; cat /sys/kernel/mm/transparent_hugepage/enabled; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/fb-base
it() { case $1 in 4M|8M) echo "-n 20 -w 3";; 1M|2M) echo "-n 40 -w 5";; *) echo "-n 100 -w 10";; esac; }
line() {  # label np coll size program and its arguments
  local l=$1 np=$2 c=$3 s=$4; shift 4
  printf "%-6s np%-2s %-14s %-5s " $l $np $c $s
  timeout 40 mpirun -np $np --bind-to none "$@" -b $s -e $s $(it $s) 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s %s", $6, $10} /[Ee]rror|failed|panick/{print}'
  echo
}
k=0
for np in 16 8 2; do for c in all_reduce reduce_scatter all_gather broadcast; do for s in 256K 512K 1M 2M 4M 8M; do
  before 540 || break 3
  k=$((k + 1))
  if [ $((k % 2)) = 1 ]; then line def $np $c $s $B $c; line slots $np $c $s -x FERROCCL_NODE_STAGE_MAX=1G $B $c
  else line slots $np $c $s -x FERROCCL_NODE_STAGE_MAX=1G $B $c; line def $np $c $s $B $c; fi
  line ompi $np $c $s /tmp/ompi_bench -C $c
done; done; done 2>&1 | tee $R/survey.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
