#!/usr/bin/env bash
# Round 68 (one H200): the second review's fixes (each send/receive decided on its own, pairs
# with unshareable buffers staged on both sides, send/receive counts checked in the exchange,
# several streams per group, events per stream, abort from a thread without a context, ncclMemAlloc
# memory mapped for peer devices): the GPU tests and nccl-tests data checks of the final build.
set -u
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
( LD_LIBRARY_PATH=$PFX/lib timeout 150 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -10
wait
F=$BUILD/f
run() { local l=$1 np=$2 b=$3; shift 3
  timeout 60 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib -x FERROCCL_TIMEOUT $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/$l.log | sort -u | tr '\n' ' ') | $(grep -E '^ +[0-9]+ ' $R/$l.log | awk '$1==8 || $1==67108864 {printf "%s:%sus/%s ", $1, $6, $7}')"; }
run sr-np2 2 $F/sendrecv_perf -b 8 -e 64M -f 8 -c 1 -n 5 -w 2
run a2a-np4 4 $F/alltoall_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1
run ar-np2 2 $F/all_reduce_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1
cd $OUT && tar czf r.tgz r && rm -rf r
