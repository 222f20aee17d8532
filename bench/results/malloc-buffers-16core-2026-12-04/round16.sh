#!/usr/bin/env bash
# Round 16 (issue 15): 2-rank broadcast and all-gather, slots against kernel copies; the 16-rank 8-byte broadcast again.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_SOCKET_IFNAME=lo
B=$PWD/.dev/bin/ferroccl-bench-new
run() { timeout 40 mpirun -np $1 --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo "${@:2}" 2>&1 | grep -E "^ +[0-9]+ " | awk '{printf "%s:%s ", $1, $6} END {print ""}'; }
for coll in broadcast all_gather; do
  for sm in 0 max; do
    if [ $sm = max ]; then e=FERROCCL_NODE_STAGE_MAX=1T; else e=FERROCCL_NODE_STAGE_MAX=0; fi
    echo "== np 2 $coll stage_max=$sm"; env $e bash -c "$(declare -f run); run 2 $B $coll -b 512K -e 128M -f 4 -n 10 -w 3 -c 0 --host-alloc"
  done
done
for i in 1 2 3; do echo "== np 16 broadcast 8 B, run $i"; run 16 $B broadcast -b 8 -e 32 -f 4 -n 100 -w 10 -c 0 --host-alloc; done
