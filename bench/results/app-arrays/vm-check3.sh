#!/usr/bin/env bash
# Two ranks with a core each on the 2-core VM, the probe's rule (ratio bound 2.0) as built:
# application-sized arrays, base against candidate, alternated, four launches, Open MPI in the
# first two.   vm-check3.sh BASE CANDIDATE OMPI_BENCH
set -u
B=$1 C=$2 O=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
it() { case $1 in 4M|8M) echo "-n 20 -w 3";; 1M|2M) echo "-n 40 -w 5";; *) echo "-n 100 -w 10";; esac; }
line() { local l=$1 c=$2 s=$3; shift 3
  printf "%-5s np2 %-14s %-5s " $l $c $s
  timeout 120 mpirun -np 2 --bind-to none "$@" -b $s -e $s $(it $s) 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s %s", $6, $10} /[Ee]rror|failed|panick/{print}'
  echo
}
for i in 1 2 3 4; do
  for cs in "all_reduce 256K" "all_reduce 512K" "all_reduce 1M" "all_reduce 2M" "reduce_scatter 64K" "reduce_scatter 128K" "reduce_scatter 256K"; do
    set -- $cs
    if [ $((i % 2)) = 1 ]; then line base $1 $2 $B $1; line cand $1 $2 $C $1; else line cand $1 $2 $C $1; line base $1 $2 $B $1; fi
    [ $i -le 2 ] && line ompi $1 $2 $O -C $1
  done
done
