#!/usr/bin/env bash
# A/B of the huge-page collapse in the asking call (A) against a thread of the rank's own (B):
# two ferroccl-bench binaries, alternating, REPS repeats, malloc'd buffers, nccl-tests' schedule
# (-n 20 -w 5: out-of-place warm-up only, so in-place columns include first-use costs).
# Usage: A=<binary> B=<binary> NP="2 4" REPS=3 bash ab_thp.sh
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for np in ${NP:-2 4}; do
  for coll in broadcast all_reduce all_gather; do
    for rep in $(seq 1 ${REPS:-3}); do
      for side in A B; do
        bin=${!side}
        echo "## np $np $coll rep $rep $side"
        mpirun -np $np --oversubscribe --bind-to none $bin $coll -b 512K -e 128M -f 4 -n 20 -w 5 2>&1 | grep -E "^ +[0-9]"
      done
    done
  done
done
