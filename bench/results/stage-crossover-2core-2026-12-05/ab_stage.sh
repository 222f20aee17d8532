#!/bin/bash
# A/B of kernel copies (stage_max 0) against slots (1T), malloc'd buffers: NP ranks (default 4),
# REPS alternating repeats (default 3), FB the ferroccl-bench binary
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NP=${NP:-4}; REPS=${REPS:-3}; FB=${FB:-target/release/ferroccl-bench}
for coll in broadcast all_gather all_reduce reduce_scatter; do
 for rep in $(seq $REPS); do for sm in 0 1T; do
  printf "%s np%s rep%s stage_max=%-3s " $coll $NP $rep $sm
  FERROCCL_NODE_STAGE_MAX=$sm timeout 200 mpirun -np $NP --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_NODE_STAGE_MAX $FB $coll -b 8K -e 32M -f 4 -n 20 -w 5 -c 0 2>&1 | grep -E "^ +[0-9]" | awk '{printf "%s %s  ", $1, $6}'; echo
 done; done
done
