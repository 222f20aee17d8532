#!/usr/bin/env bash
# Round 126 (device machine, 2026-12-06): GPU tests after the grouped test's fix (round 125 found
# that the staged path, like NCCL, does not order a group's dependent operations), and single
# operations (-m 1) at 2 and 4 ranks before / after the batch change in four alternations (round
# 125's two 2-rank runs of the new build were 11.7-12.0 us against 8.9-11.3).
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; date -u; } > $R/host.txt 2>&1; cat $R/host.txt
( make -C $SRC -j8 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl build rc=$?" ) &
( make -C $SRC -j8 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix-prev NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/p >$BUILD/p.log 2>&1; echo "prev build rc=$?" ) &
timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
wait
F=$BUILD/f; P=$BUILD/p
run() { # label lib np bin args
  local l=$1 lib=$2 np=$3 b=$4; shift 4
  timeout 60 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$lib $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -E '^ +8 ' $R/$l.log | head -1 | awk '{print "8B oop", $6, "us ip", $10, "us"}')"
}
for rep in 1 2 3 4; do
  for np in 2 4; do
    run prev-np$np-m1-$rep $PWD/.dev/prefix-prev/lib $np $P/all_reduce_perf -b 8 -e 8 -c 1 -n 300 -w 30
    run new-np$np-m1-$rep $PWD/.dev/prefix/lib $np $F/all_reduce_perf -b 8 -e 8 -c 1 -n 300 -w 30
  done
done
el "single-op latency"
cd $OUT && tar czf r.tgz r && rm -rf r
