#!/usr/bin/env bash
# Round 58 (one H200): GPUs told apart by PCI location; the peer-GPU path (own all-gather
# block copied on its own GPU, each rank folding its own reduce-scatter block) run on one GPU
# with FERROCCL_PEER_PATH_ON_ONE_GPU=1: the GPU tests, then nccl-tests data checks at 2, 3 and
# 4 ranks with the switch on, and the plain one-GPU path at 2 and 4 ranks.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
( LD_LIBRARY_PATH=$PFX/lib timeout 200 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED|^test " $R/it-cuda.txt | head -30
wait
el "built + it"
F=$BUILD/f
run() { # label np peer bin args
  local l=$1 np=$2 peer=$3 b=$4; shift 4
  timeout 120 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib -x FERROCCL_PEER_PATH_ON_ONE_GPU=$peer -x FERROCCL_TIMEOUT -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ') $(grep -m1 -oE 'ranks on [0-9]+ GPUs with peer access|processes share CUDA device' $R/$l.log)"
}
for np in 2 3 4; do
  run peer-ag-np$np $np 1 $F/all_gather_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
  run peer-rs-np$np $np 1 $F/reduce_scatter_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1 -o sum,max,avg
done
run peer-rs-np4-all 4 1 $F/reduce_scatter_perf -b 8 -e 4M -f 8 -c 1 -n 2 -w 1 -d all -o sum,prod,min
run peer-ar-np3 3 1 $F/all_reduce_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
run peer-bc-np3 3 1 $F/broadcast_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
run peer-rs-np2-G 2 1 $F/reduce_scatter_perf -b 8 -e 16M -f 8 -c 1 -n 5 -w 2 -G 10
run peer-ag-np2-G 2 1 $F/all_gather_perf -b 8 -e 16M -f 8 -c 1 -n 5 -w 2 -G 10
el "peer path"
run one-rs-np4 4 0 $F/reduce_scatter_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
run one-ag-np2 2 0 $F/all_gather_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
run one-ar-np2 2 0 $F/all_reduce_perf -b 8 -e 64M -f 4 -c 1 -n 2 -w 1
el "one-GPU path"
cd $OUT && tar czf r.tgz r && rm -rf r
