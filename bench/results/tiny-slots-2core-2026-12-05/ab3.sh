#!/usr/bin/env bash
# Before/after ferroccl (malloc'd and ncclMemAlloc buffers) and Open MPI, alternating, 2 ranks.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
M="mpirun -np 2 --bind-to none -x NCCL_SOCKET_IFNAME=lo"
for rep in 1 2 3; do
  for coll in all_reduce broadcast reduce_scatter; do
    for which in A B; do bin=${!which}
      for alloc in system nccl; do
        $M $bin $coll -b 32 -e 128 -f 2 -n 50000 -w 1000 -c 1 --alloc $alloc 2>&1 |
          awk -v c=$coll -v r=$rep -v w=$which -v a=$alloc '/^ +[0-9]+ /{print c, "rep" r, w, a, "size=" $1, "oop=" $6, "wrong=" $9}'
      done
    done
    $M $OMPI -C $coll -b 32 -e 128 -f 2 -n 50000 -w 1000 2>&1 |
      awk -v c=$coll -v r=$rep '/^ +[0-9]+ /{print c, "rep" r, "ompi", "malloc", "size=" $1, "oop=" $6, "wrong=" $9}'
  done
done
