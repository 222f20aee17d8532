#!/usr/bin/env bash
# Round 43: the fold kernel's plain-copy path (four loads in flight per thread) and streaming
# stores from 4 MiB per output. GPU tests and nccl-tests correctness on the new kernel; then
# 8-rank all_gather, broadcast, all_reduce, reduce_scatter at 256 MiB-1 GiB, before
# (.dev/prefix-old) against after (.dev/prefix), alternating; copy bandwidth in the same run.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; OLD=$PWD/.dev/prefix-old; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
nvcc -O2 $GEN bench/gpu/copy_bw.cu -o $BUILD/copy_bw > $R/copy_build.txt 2>&1; echo "copy_bw build rc=$?"
wait
( LD_LIBRARY_PATH=$PFX/lib timeout 120 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -20
el "built + it"
F=$BUILD/f
run() { # label np lib bin args
  local l=$1 np=$2 lib=$3 b=$4; shift 4
  timeout 150 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$lib $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
}
run chk-ag-np8 8 $PFX/lib $F/all_gather_perf -b 8 -e 1G -f 4 -c 1 -n 2 -w 1
run chk-bc-np4 4 $PFX/lib $F/broadcast_perf -b 8 -e 1G -f 4 -d all -c 1 -n 2 -w 1
run chk-a2a-np4 4 $PFX/lib $F/alltoall_perf -b 8 -e 256M -f 8 -c 1 -n 2 -w 1
run chk-ar-np3 3 $PFX/lib $F/all_reduce_perf -b 8 -e 256M -f 8 -d all -o all -c 1 -n 1 -w 1
run chk-rs-np4 4 $PFX/lib $F/reduce_scatter_perf -b 8 -e 256M -f 8 -d float,half -o sum,max -c 1 -n 1 -w 1
el "correctness"
$BUILD/copy_bw 1024 > $R/copy_bw-1.txt 2>&1; cat $R/copy_bw-1.txt
perf() { run $1 8 $2 $F/${3}_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
  grep -E '^ +[0-9]+ ' $R/$1.log | awk '{print "   ", $1, "oop", $6, "us", $8, "GB/s; ip", $10, "us", $12, "GB/s"}'; }
for rep in 1 2; do
  for c in all_gather broadcast; do perf $c-old-$rep $OLD/lib $c; perf $c-new-$rep $PFX/lib $c; done
done
for c in all_reduce reduce_scatter; do perf $c-old $OLD/lib $c; perf $c-new $PFX/lib $c; done
$BUILD/copy_bw 1024 > $R/copy_bw-2.txt 2>&1; cat $R/copy_bw-2.txt
el "perf"
cd $OUT && tar czf r.tgz r && rm -rf r
