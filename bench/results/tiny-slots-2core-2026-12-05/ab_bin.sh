#!/usr/bin/env bash
# Alternating A/B of two ferroccl-bench binaries at small sizes (malloc'd buffers).
# usage: A=path B=path NP=2 REPS=5 N=50000 bash ab_bin.sh
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for rep in $(seq 1 $REPS); do
  for coll in all_reduce all_gather reduce_scatter broadcast; do
    for which in A B; do
      bin=${!which}
      mpirun -np $NP --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo $bin $coll -b 8 -e 1K -f 2 -n $N -w 1000 -c 1 2>&1 |
        awk -v c=$coll -v np=$NP -v r=$rep -v w=$which '/^ +[0-9]+ /{print c, "np" np, "rep" r, w, "size=" $1, "oop=" $6, "ip=" $10, "wrong=" $9+$13}'
    done
  done
done
