#!/usr/bin/env bash
# Round 64 (one H200): one thread driving every rank (ncclCommInitAll, grouped calls over the
# communicators) on the one-GPU and peer paths; peer path with rank threads; then the GPU
# tests in full and nccl-tests data checks of the final build (one-GPU path, peer path,
# sendrecv/alltoall).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
( LD_LIBRARY_PATH=$PFX/lib timeout 60 .dev/it cuda::one_thread --test-threads 1 > $R/it-one-thread.txt 2>&1; echo "it one_thread rc=$?" )
grep -E "^test |test result|panicked" $R/it-one-thread.txt | head -10
( LD_LIBRARY_PATH=$PFX/lib timeout 240 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -10
wait
el "built + it"
F=$BUILD/f
run() { # label np extra-env bin args
  local l=$1 np=$2 env=$3 b=$4; shift 4
  timeout 120 env $env mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib -x FERROCCL_TIMEOUT -x FERROCCL_PEER_PATH_ON_ONE_GPU $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/$l.log | sort -u | tr '\n' ' ')"
}
for c in all_reduce all_gather reduce_scatter broadcast; do run one-$c-np4 4 "" $F/${c}_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1; done
for c in all_reduce all_gather reduce_scatter; do run peer-$c-np2 2 "FERROCCL_PEER_PATH_ON_ONE_GPU=1" $F/${c}_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1; done
run sr-np2 2 "" $F/sendrecv_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1
run a2a-np3 3 "" $F/alltoall_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1
el "checks"
cd $OUT && tar czf r.tgz r && rm -rf r
