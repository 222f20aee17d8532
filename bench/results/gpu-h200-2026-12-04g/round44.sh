#!/usr/bin/env bash
# Round 44 (7624c4b: one kernel per all-gather / gather, one per rank for all-to-all, on one
# GPU): GPU tests including the kernels' GPU test (cuda_kernels); nccl-tests correctness of the
# grouped copies (in and out of place); 8-rank all_gather latency at small sizes and busbw at
# 256 MiB-1 GiB, before (.dev/prefix-old = c613ad8) against after, alternating; Nsight Compute
# on the bare fan-out kernel against a copy.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; OLD=$PWD/.dev/prefix-old; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
nvcc -O2 $GEN bench/gpu/fanout_bw.cu -o $BUILD/fanout_bw > $R/fanout_build.txt 2>&1; echo "fanout_bw build rc=$?"
wait
( LD_LIBRARY_PATH=$PFX/lib timeout 150 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED|grouped copies" $R/it-cuda.txt | head -20
el "built + it"
F=$BUILD/f
run() { # label np lib bin args
  local l=$1 np=$2 lib=$3 b=$4; shift 4
  timeout 150 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$lib $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
}
run chk-ag-np8 8 $PFX/lib $F/all_gather_perf -b 8 -e 512M -f 4 -d all -c 1 -n 2 -w 1
run chk-ag-np3 3 $PFX/lib $F/all_gather_perf -b 8 -e 64M -f 2 -c 1 -n 2 -w 1
run chk-gather-np4 4 $PFX/lib $F/gather_perf -b 8 -e 256M -f 4 -c 1 -n 2 -w 1
run chk-a2a-np8 8 $PFX/lib $F/alltoall_perf -b 8 -e 256M -f 4 -c 1 -n 2 -w 1
run chk-a2a-np3 3 $PFX/lib $F/alltoall_perf -b 8 -e 64M -f 2 -c 1 -n 2 -w 1
el "correctness"
lat() { run $1 8 $2 $F/all_gather_perf -b 1K -e 1M -f 8 -c 1 -n 200 -w 20
  grep -E '^ +[0-9]+ ' $R/$1.log | awk '{printf "%s:%s/%s ", $1, $6, $10} END {print ""}'; }
big() { run $1 8 $2 $F/${3}_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
  grep -E '^ +[0-9]+ ' $R/$1.log | awk '{printf "%s:%s GB/s (ip %s) ", $1, $8, $12} END {print ""}'; }
for rep in 1 2; do
  lat ag-lat-old-$rep $OLD/lib; lat ag-lat-new-$rep $PFX/lib
  big ag-old-$rep $OLD/lib all_gather; big ag-new-$rep $PFX/lib all_gather
done
big a2a-old $OLD/lib alltoall; big a2a-new $PFX/lib alltoall
el "perf"
timeout 120 ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum -k regex:fanout -c 52 $BUILD/fanout_bw 8 256 > $R/ncu-fanout.txt 2>&1; echo "ncu rc=$?"
grep -E "fanout|dram__|gpu__time|==PROF==|Error" $R/ncu-fanout.txt | head -40
el "ncu"
cd $OUT && tar czf r.tgz r && rm -rf r
