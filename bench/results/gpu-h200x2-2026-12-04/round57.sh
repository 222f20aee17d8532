#!/usr/bin/env bash
# Round 57 (two H200s, branch p2p-ag): each rank copies its own all-gather block on its own GPU
# and rank 0's kernel sends it across once. GPU tests (one GPU), then all_gather on two GPUs,
# ferroccl against NCCL 2.28 alternating, and all_reduce / broadcast / reduce_scatter once each
# (data checked everywhere).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=20
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests (ferroccl) build rc=$?" ) &
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl-tests (NCCL) build rc=$?" ) &
( CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$PFX/lib timeout 60 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -10
wait
el "built + it"
F=$BUILD/f N=$BUILD/n
run() { # label lib timeout bin args
  local l=$1 lib=$2 t=$3 b=$4; shift 4
  timeout $t mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$lib -x NCCL_NVLS_ENABLE -x FERROCCL_TIMEOUT $b "$@" > $R/$l.log 2>&1
  local rc=$?
  echo "$l rc=$rc $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ') | $(grep -E '^ +[0-9]+ ' $R/$l.log | awk '$1==32 || $1==2097152 || $1==33554432 || $1==134217728 || $1==536870912 {printf "%s:%sus/%s(ip %s) ", $1, $6, $8, $12}')"
  return $rc
}
for rep in 1 2; do
  run ferroccl-all_gather-$rep $PFX/lib 30 $F/all_gather_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3 || break
  run nccl-all_gather-$rep /usr/lib/x86_64-linux-gnu 30 $N/all_gather_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
done
for c in all_reduce broadcast reduce_scatter; do run ferroccl-$c $PFX/lib 30 $F/${c}_perf -b 8 -e 1G -f 4 -c 1 -n 10 -w 3; done
el "two GPUs"
cd $OUT && tar czf r.tgz r && rm -rf r
