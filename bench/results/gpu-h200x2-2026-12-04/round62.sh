#!/usr/bin/env bash
# Round 62 (two H200s; run when nvidia-h200-x2 is lent): the own-share all-gather and
# reduce-scatter and device point-to-point (checked on one GPU in rounds 58-61) timed against
# NCCL 2.28.3, one process per GPU: GPU tests on two GPUs first, then all_gather,
# reduce_scatter, sendrecv and alltoall, ferroccl and NCCL alternating twice, then all_reduce
# and broadcast once each, one process driving both GPUs (-g 2, -t 2; sends and receives by
# address since d9fef3d), and the CUDA_VISIBLE_DEVICES case (each process sees its GPU as
# device 0: told apart by PCI location now).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=20
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi topo -m > $R/topo.txt 2>&1; head -4 $R/topo.txt
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests (ferroccl) build rc=$?" ) &
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl-tests (NCCL) build rc=$?" ) &
( LD_LIBRARY_PATH=$PFX/lib timeout 150 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -10
wait
el "built + it"
F=$BUILD/f N=$BUILD/n
run() { # label lib timeout bin args
  local l=$1 lib=$2 t=$3 b=$4; shift 4
  timeout $t mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$lib -x NCCL_NVLS_ENABLE -x FERROCCL_TIMEOUT $b "$@" > $R/$l.log 2>&1
  local rc=$?
  echo "$l rc=$rc $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/$l.log | sort -u | tr '\n' ' ') | $(grep -E '^ +[0-9]+ ' $R/$l.log | awk '$1==8 || $1==2097152 || $1==67108864 || $1==536870912 {printf "%s:%sus/%s ", $1, $6, $8}')"
  return $rc
}
for rep in 1 2; do
  for c in all_gather reduce_scatter sendrecv alltoall; do
    run ferroccl-$c-$rep $PFX/lib 40 $F/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
    run nccl-$c-$rep /usr/lib/x86_64-linux-gnu 40 $N/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
  done
done
for c in all_reduce broadcast; do
  run ferroccl-$c-1 $PFX/lib 40 $F/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
  run nccl-$c-1 /usr/lib/x86_64-linux-gnu 40 $N/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
done
el "two GPUs"
# One process driving both GPUs (nccl-tests -g 2: one thread, ncclCommInitAll-style group) and
# two threads of one process (-t 2): sends and receives between GPUs of one process copy by
# address since d9fef3d (before: staged through host memory).
for c in sendrecv alltoall all_reduce; do for mode in "-g 2" "-t 2"; do
  m=${mode// /}
  for lib in ferroccl nccl; do
    [ $lib = ferroccl ] && L=$PFX/lib B=$F || L=/usr/lib/x86_64-linux-gnu B=$N
    timeout 40 mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH=$L -x NCCL_NVLS_ENABLE -x FERROCCL_TIMEOUT \
      -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=P2P $B/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3 $mode > $R/$lib-$c$m.log 2>&1
    echo "$lib-$c$m rc=$? wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/$lib-$c$m.log | sort -u | tr '\n' ' ') direct=$(grep -c 'P2P/direct' $R/$lib-$c$m.log) | $(grep -E '^ +[0-9]+ ' $R/$lib-$c$m.log | awk '$1==8 || $1==2097152 || $1==67108864 || $1==536870912 {printf "%s:%sus/%s ", $1, $6, $8}')"
  done
done; done
el "one process, two GPUs"
# Side-by-side tables with the busbw ratio at every size and issue 18's verdicts.
if command -v python3 >/dev/null; then
  for f in $R/ferroccl-*.log; do
    n=$R/nccl-${f#$R/ferroccl-}; [ -f "$n" ] || continue
    python3 bench/gpu/nccl_tests_compare.py "$f" "$n" --title "$(basename $f .log)" >> $R/compare.md 2>&1; echo >> $R/compare.md
  done
  grep -E "^### |^- (busbw|latency|ferroccl #wrong)" $R/compare.md
fi
# Each process sees only its own GPU (device 0 in both): a wrapper sets CUDA_VISIBLE_DEVICES by local rank.
printf '#!/bin/sh\nexport CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK\nexec "$@"\n' > $BUILD/vis.sh; chmod +x $BUILD/vis.sh
timeout 40 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,P2P $BUILD/vis.sh $F/all_reduce_perf -b 8 -e 64M -f 8 -c 1 -n 5 -w 2 > $R/visible-ar.log 2>&1
echo "visible-ar rc=$? wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/visible-ar.log | sort -u | tr '\n' ' ') $(grep -m2 -oE 'ranks on [0-9]+ GPUs with peer access|processes share CUDA device [0-9]+|P2P/IPC' $R/visible-ar.log | tr '\n' ' ')"
el "visible devices"
cd $OUT && tar czf r.tgz r && rm -rf r
