#!/usr/bin/env bash
# The oversubscribed off-huge rule as built, on the 2-core VM, 4 ranks: application-sized
# arrays (-b S -e S) and the benchmark's one buffer sized for the largest message (-b 256K
# -e 8M), base (4b84124) against the candidate, alternated, three launches; Open MPI once.
#   vm-check.sh BASE CANDIDATE OMPI_BENCH
set -u
B=$1 C=$2 O=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
it() { case $1 in 4M|8M) echo "-n 20 -w 3";; 1M|2M) echo "-n 40 -w 5";; *) echo "-n 100 -w 10";; esac; }
line() { local l=$1 c=$2 s=$3; shift 3
  printf "%-5s np4 %-14s %-5s " $l $c $s
  timeout 120 mpirun -np 4 --bind-to none "$@" 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s:%s/%s ", $1, $6, $10} /[Ee]rror|failed|panick|wrong/{print}'
  echo
}
for i in 1 2 3; do
  for c in all_reduce reduce_scatter all_gather broadcast; do
    for s in 256K 1M 2M 4M; do
      if [ $((i % 2)) = 1 ]; then line base $c $s $B $c -b $s -e $s $(it $s); line cand $c $s $C $c -b $s -e $s $(it $s)
      else line cand $c $s $C $c -b $s -e $s $(it $s); line base $c $s $B $c -b $s -e $s $(it $s); fi
      [ $i = 1 ] && line ompi $c $s $O -C $c -b $s -e $s $(it $s)
    done
    if [ $((i % 2)) = 1 ]; then line base $c bench $B $c -b 256K -e 8M -f 2 -n 40 -w 5; line cand $c bench $C $c -b 256K -e 8M -f 2 -n 40 -w 5
    else line cand $c bench $C $c -b 256K -e 8M -f 2 -n 40 -w 5; line base $c bench $B $c -b 256K -e 8M -f 2 -n 40 -w 5; fi
  done
done
