#!/usr/bin/env bash
# Two ranks with a core each on the 2-core VM, where the probe finds kernel copies of 4 KiB pages
# slow: application-sized arrays (-b S -e S) and the benchmark's one buffer (-b 32K -e 8M),
# base against the candidate, alternated, three launches; Open MPI once.
#   vm-check2.sh BASE CANDIDATE OMPI_BENCH
set -u
B=$1 C=$2 O=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
it() { case $1 in 4M|8M) echo "-n 20 -w 3";; 1M|2M) echo "-n 40 -w 5";; *) echo "-n 100 -w 10";; esac; }
line() { local l=$1 c=$2 s=$3; shift 3
  printf "%-5s np2 %-14s %-5s " $l $c $s
  timeout 120 mpirun -np 2 --bind-to none "$@" 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s:%s/%s ", $1, $6, $10} /[Ee]rror|failed|panick/{print}'
  echo
}
pair() { # label-free: coll size args...
  local c=$1 s=$2; shift 2
  if [ $((i % 2)) = 1 ]; then line base $c $s $B $c "$@"; line cand $c $s $C $c "$@"
  else line cand $c $s $C $c "$@"; line base $c $s $B $c "$@"; fi
}
for i in 1 2 3; do
  for s in 256K 512K 1M 2M 4M; do pair all_reduce $s -b $s -e $s $(it $s); [ $i = 1 ] && line ompi all_reduce $s $O -C all_reduce -b $s -e $s $(it $s); done
  for s in 32K 64K 128K 256K 512K; do pair reduce_scatter $s -b $s -e $s $(it $s); [ $i = 1 ] && line ompi reduce_scatter $s $O -C reduce_scatter -b $s -e $s $(it $s); done
  pair all_reduce bench -b 32K -e 8M -f 2 -n 40 -w 5
  pair reduce_scatter bench -b 32K -e 8M -f 2 -n 40 -w 5
done
