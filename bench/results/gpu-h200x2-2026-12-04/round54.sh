#!/usr/bin/env bash
# Round 54, first run on two H200s (nvidia-h200-x2), final build of the session: GPU tests and
# one-GPU nccl-tests correctness of the final build; then issue 18's comparison at 2 GPUs, one
# process per GPU: nccl-tests built against NCCL 2.28 (as installed) and against ferroccl,
# all_reduce / all_gather / reduce_scatter / broadcast / sendrecv, 8 B-1 GiB, data checked.
# ferroccl has no GPU-to-GPU path yet (ranks on different GPUs stage through host memory), so
# this records correctness on two GPUs and the gap that the NVLink path has to close.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi -L; nvidia-smi topo -m > $R/topo.txt 2>&1; head -4 $R/topo.txt; nproc
( make -C $SRC -j14 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests (ferroccl) build rc=$?" ) &
( make -C $SRC -j14 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl-tests (NCCL) build rc=$?" ) &
( CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$PFX/lib timeout 120 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -20
wait
el "built + it"
F=$BUILD/f N=$BUILD/n
run() { # label np lib timeout bin args
  local l=$1 np=$2 lib=$3 t=$4 b=$5; shift 5
  timeout $t mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE -x LD_LIBRARY_PATH=$lib -x NCCL_NVLS_ENABLE -x FERROCCL_TIMEOUT $b "$@" > $R/$l.log 2>&1
  local rc=$?
  echo "$l rc=$rc $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
  return $rc
}
export NCCL_TESTS_DEVICE=0
for c in all_reduce broadcast reduce_scatter all_gather; do run one-$c-np4 4 $PFX/lib 60 $F/${c}_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1; done
unset NCCL_TESTS_DEVICE
el "one-GPU correctness"
ok=1
for c in all_reduce all_gather reduce_scatter broadcast sendrecv; do
  run nccl-$c 2 /usr/lib/x86_64-linux-gnu 60 $N/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
  if [ $ok = 1 ]; then run ferroccl-$c 2 $PFX/lib 90 $F/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3 || ok=0; fi
  for l in nccl-$c ferroccl-$c; do [ -f $R/$l.log ] && echo "  $l: $(grep -E '^ +[0-9]+ ' $R/$l.log | awk '$1==8 || $1==1048576 || $1==67108864 || $1==1073741824 {printf "%s:%sus/%sGB/s ", $1, $6, $8}')"; done
  el "$c"
done
grep -h "Transports\|NCCL version\|nccl-tests" $R/ferroccl-all_reduce.log $R/nccl-all_reduce.log 2>/dev/null | head -6
cd $OUT && tar czf r.tgz r && rm -rf r
