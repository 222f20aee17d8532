#!/usr/bin/env bash
# Round 72 (16-core host; issue 15): huge pages under malloc'd buffers reached by kernel
# copies (FERROCCL_HUGE_PAGES, new, default on) against off, alternating, ferroccl-bench
# all_reduce / reduce_scatter / all_gather at 8 and 16 ranks, all-gathers at 8 ranks by kernel
# copies against slots; then compare_ompi.sh (Open MPI
# 4.1.6) at 8 and 16 ranks, 1-128 MiB, all four collectives, with the default (on).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
B=$PWD/.dev/bin/ferroccl-bench
# First the GPU tests on this build (the last session's final commits only moved code; checked here).
( LD_LIBRARY_PATH=$PWD/.dev/prefix/lib FERROCCL_TIMEOUT=30 timeout 150 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -10; el gpu-tests
for np in 8 16; do for c in all_reduce reduce_scatter all_gather; do for rep in 1 2; do for hp in 0 1; do
  echo "== np $np $c huge $hp rep $rep" >> $R/ab.txt
  timeout 90 mpirun -np $np --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_HUGE_PAGES=$hp -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=SHM $B $c -b 1M -e 32M -f 2 -n 20 -w 5 > $R/run.txt 2>&1
  grep -E "^ +[0-9]+ " $R/run.txt >> $R/ab.txt; grep -m3 "huge pages" $R/run.txt >> $R/ab.txt
done; done; done; done
# All-gathers at 8 ranks go through slots at every size; with huge pages, do kernel copies win?
for rep in 1 2; do for sm in default 0; do
  X=""; [ $sm = 0 ] && X="-x FERROCCL_NODE_STAGE_MAX=0"
  echo "== np 8 all_gather stage_max $sm rep $rep" >> $R/ab.txt
  timeout 90 mpirun -np 8 --bind-to none -x NCCL_SOCKET_IFNAME=lo $X $B all_gather -b 1M -e 32M -f 2 -n 20 -w 5 2>&1 | grep -E "^ +[0-9]+ " >> $R/ab.txt
done; done
cat $R/ab.txt | grep -v "huge pages"; grep "huge pages" $R/ab.txt | head -5; el ab
timeout 400 bench/compare_ompi.sh -np 8,16 --sizes 1M:128M --factor 2 --repeat 1 --no-build --ferroccl-bench $B --timeout 120 --out $R/np8-16 > $R/np8-16.txt 2>&1; echo "compare rc=$?"
grep -A40 "^## Targets" $R/np8-16.md | head -20; el compare
cd $OUT && tar czf r.tgz r && rm -rf r
