#!/usr/bin/env bash
# Round 55 (two H200s, 32 cores): which transport ferroccl picks between ranks on two GPUs
# (INIT log of a 2-GPU all_reduce), and the small-call path before (c1c4ebd) and after
# (wt-fastcall merged) on this many-core host: 2 ranks, broadcast and all_reduce 8 B-2 KiB,
# 20000 calls per size, alternating x3.
set -u
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
make -C $SRC -j30 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "build rc=$?"
timeout 60 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT -x NCCL_NVLS_ENABLE $BUILD/f/all_reduce_perf -b 64M -e 64M -c 1 -n 5 -w 1 > $R/init-2gpu.log 2>&1; echo "init run rc=$?"
grep -iE "transport|P2P|SHM|NET/|staged|device" $R/init-2gpu.log | head -12
OLD=$PWD/.dev/bin/ferroccl-bench-c1c4ebd NEW=$PWD/.dev/bin/ferroccl-bench
ab() { local l=$1 bin=$2; shift 2
  timeout 60 mpirun -np 2 --bind-to none $bin "$@" > $R/ab-$l.txt 2>&1
  echo "ab $l rc=$? $(awk '$1 ~ /^[0-9]+$/ {printf "%s:%s ", $1, $6}' $R/ab-$l.txt)"; }
for rep in 1 2 3; do for c in broadcast all_reduce; do
  ab $c-old-$rep $OLD $c -b 8 -e 2K -f 4 -n 20000 -w 1000
  ab $c-new-$rep $NEW $c -b 8 -e 2K -f 4 -n 20000 -w 1000
done; done
cd $OUT && tar czf r.tgz r && rm -rf r
