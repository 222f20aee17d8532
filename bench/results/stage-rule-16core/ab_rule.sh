#!/bin/bash
# Before/after A/B of node::default_stage_max's 16-core change (9f4180b, revised after), one binary: "new" is
# the default rule, "old" forces the old rule's value for that collective and rank count through
# FERROCCL_NODE_STAGE_MAX (the old rule was one value per collective and rank count).
# Malloc'd buffers, out of place, REPS alternating repeats; FB the ferroccl-bench binary.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
REPS=${REPS:-3}; FB=${FB:-target/release/ferroccl-bench}
# collective:ranks:old-stage-max (CELLS), and buffer ranges (SEGS: nccl-tests sizes its buffers by
# the largest size, so a 512K sweep runs on 4 KiB pages and a 32M one on huge pages)
CELLS=${CELLS:-"broadcast:8:1T broadcast:16:1T all_gather:8:1T reduce_scatter:2:1T reduce_scatter:8:1M reduce_scatter:16:128K"}
SEGS=${SEGS:-"8K:32M"}
for cell in $CELLS; do
 IFS=: read coll np old <<< "$cell"
 for rep in $(seq $REPS); do for which in new old; do
  printf "%s np%s rep%s %-3s " $coll $np $rep $which
  if [ $which = old ]; then export FERROCCL_NODE_STAGE_MAX=$old; else unset FERROCCL_NODE_STAGE_MAX; fi
  for seg in $SEGS; do
   timeout 200 mpirun -np $np --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo $( [ $which = old ] && echo -x FERROCCL_NODE_STAGE_MAX ) $FB $coll -b ${seg%:*} -e ${seg#*:} -f 4 -n 20 -w 5 -c 0 2>&1 | grep -E "^ +[0-9]" | awk '{printf "%s %s  ", $1, $6}'
  done; echo
 done; done
done
