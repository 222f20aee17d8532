#!/usr/bin/env bash
# Round 90 (16-core host, build in .dev): warm_inputs (load every line of the peers' pieces,
# staggered, before a fold at >= 3 ranks) A/B with the default stage rule: .dev/exp/fb-base
# (before), fb-new (reduce-scatter and all-reduce), fb-noar (reduce-scatter only), 16 and 8 ranks,
# 3 alternating launches, then compare_ompi.sh (reduce_scatter, all_reduce) with fb-new at 16 and
# 8 ranks, malloc'd and ncclMemAlloc buffers, 2 repeats. Raw logs kept under $OUT.
set -u
T0=$(date +%s); R=$OUT/r3; mkdir -p $R/tmp
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; } > $R/host.txt
run() { timeout 100 mpirun -np $NP --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo "$@" 2>&1 | grep -E "^ +[0-9]" | awk '{printf "%s %s w%s  ", $1/1024, $6, $9}'; echo; }
for NP in 16 8; do
  for rep in 1 2 3; do
    for v in base new noar; do
      printf "rs np$NP rep$rep %-5s " $v; run .dev/exp/fb-$v reduce_scatter -b 8K -e 512K -f 2 -n 200 -w 20 -c 1
      [ $v = noar ] && continue
      printf "ar np$NP rep$rep %-5s " $v; run .dev/exp/fb-$v all_reduce -b 8K -e 512K -f 2 -n 200 -w 20 -c 1
    done
  done
done > $R/ab.txt 2>&1
cat $R/ab.txt; el ab
for NP in 16 8; do
  TMPDIR=$R/tmp timeout 190 bench/compare_ompi.sh -np $NP --colls reduce_scatter,all_reduce --sizes 8:128M --factor 4 --repeat 2 --both-allocs --no-build --keep-logs --ferroccl-bench $PWD/.dev/exp/fb-new --timeout 100 --out $R/np$NP > $R/np$NP.txt 2>&1; echo "compare np$NP rc=$?"
  grep -A12 "^## Targets" $R/np$NP.md; el "compare np$NP"
done
cd $OUT && tar czf r3.tgz r3 && rm -rf r3
