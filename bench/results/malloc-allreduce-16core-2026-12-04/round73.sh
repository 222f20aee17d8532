#!/usr/bin/env bash
# Round 73 (16-core host; issue 15), READY for the next session (this one's device time ran
# out): the final build against Open MPI 4.1.6 on a quiet host, 8 and 16 ranks, 8 B-128 MiB,
# all four collectives, two alternating repeats, then FERROCCL_HUGE_PAGES off/on alternating
# for all-reduce and reduce-scatter at 8 and 16 ranks. Rebuild .dev/bin/ferroccl-bench first.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
B=$PWD/.dev/bin/ferroccl-bench
timeout 480 bench/compare_ompi.sh -np 8,16 --sizes 8:128M --factor 4 --repeat 2 --both-allocs --no-build --ferroccl-bench $B --timeout 120 --out $R/np8-16 > $R/np8-16.txt 2>&1; echo "compare rc=$?"
grep -A16 "^## Targets" $R/np8-16.md; el compare
for np in 8 16; do for c in all_reduce reduce_scatter; do for rep in 1 2; do for hp in 0 1; do
  echo "== np $np $c huge $hp rep $rep" >> $R/ab.txt
  timeout 60 mpirun -np $np --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_HUGE_PAGES=$hp $B $c -b 1M -e 32M -f 2 -n 20 -w 5 2>/dev/null | grep -E "^ +[0-9]+ " >> $R/ab.txt
done; done; done; done
awk '/^==/{h=$0} /^ +[0-9]+ /{print h, $1, $6}' $R/ab.txt | head -80; el ab
cd $OUT && tar czf r.tgz r && rm -rf r
