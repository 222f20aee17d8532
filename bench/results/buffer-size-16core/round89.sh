#!/usr/bin/env bash
# Round 89 (16-core host, build in .dev): round 88 (buffer size, Open MPI and ferroccl-bench in
# 512 KiB and 128 MiB buffers), then experimental builds of the reduce-scatter through slots
# (.dev/exp/fb-*: base; nt = the copy into the slot with non-temporal stores; touch = before
# folding, read one byte per line of every peer's piece, peers in staggered order (rank me + k),
# so that not all ranks pull from rank 0 first), 16 and 8 ranks, slots forced, 3 alternating launches.
set -u
bash bench/results/buffer-size-16core/round88.sh
R=$OUT/r2; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { timeout 100 mpirun -np $NP --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_NODE_STAGE_MAX "$@" 2>&1 | grep -E "^ +[0-9]" | awk '{printf "%s %s w%s  ", $1/1024, $6, $9}'; echo; }
for NP in 16 8; do
  for rep in 1 2 3; do
    for v in base nt touch nt-touch; do
      printf "rs np$NP rep$rep %-8s " $v
      FERROCCL_NODE_STAGE_MAX=1T run .dev/exp/fb-$v reduce_scatter -b 32K -e 2M -f 2 -n 100 -w 10 -c 1
    done
  done
done > $R/exp.txt 2>&1
cat $R/exp.txt
cd $OUT && tar czf r2.tgz r2 && rm -rf r2
