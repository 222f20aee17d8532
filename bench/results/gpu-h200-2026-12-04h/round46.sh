#!/usr/bin/env bash
# Round 46 (build c1c4ebd): the GPU tests and nccl-tests correctness of the one-kernel
# reduce-scatter (bdaef58, never run on a GPU), 8-rank reduce_scatter busbw at 256 MiB-1 GiB
# with the copy ceiling measured beside it; Nsight Compute DRAM counters of the bare fan-out
# kernel (base and unroll4, P = 8, 256 MiB); the merged small-message changes on 16 cores
# against Open MPI (2 and 4 ranks, 8 B-16 KiB, all_reduce and broadcast).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
nvcc -O2 $GEN bench/gpu/fanout_bw.cu -o $BUILD/fanout_bw > $R/fanout_build.txt 2>&1; echo "fanout_bw build rc=$?"
nvcc -O2 $GEN bench/gpu/copy_bw.cu -o $BUILD/copy_bw > $R/copy_build.txt 2>&1; echo "copy_bw build rc=$?"
wait
( LD_LIBRARY_PATH=$PFX/lib timeout 150 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -20
el "built + it"
F=$BUILD/f
run() { # label np lib bin args
  local l=$1 np=$2 lib=$3 b=$4; shift 4
  timeout 120 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$lib $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
}
run chk-rs-np2 2 $PFX/lib $F/reduce_scatter_perf -b 8 -e 256M -f 4 -c 1 -n 2 -w 1
run chk-rs-np4 4 $PFX/lib $F/reduce_scatter_perf -b 8 -e 256M -f 4 -c 1 -n 2 -w 1
run chk-rs-np8 8 $PFX/lib $F/reduce_scatter_perf -b 8 -e 512M -f 4 -c 1 -n 2 -w 1 -d all -o sum,max
run chk-rs-np3 3 $PFX/lib $F/reduce_scatter_perf -b 8 -e 64M -f 2 -c 1 -n 2 -w 1 -d bfloat16
run chk-ag-np8 8 $PFX/lib $F/all_gather_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1
run chk-a2a-np4 4 $PFX/lib $F/alltoall_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1
run chk-ar-np4-G 4 $PFX/lib $F/all_reduce_perf -b 8 -e 16M -f 8 -c 1 -n 5 -w 2 -G 10
el "correctness"
big() { run $1 8 $PFX/lib $F/${2}_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
  grep -E '^ +[0-9]+ ' $R/$1.log | awk '{printf "%s:%s GB/s (ip %s) ", $1, $8, $12} END {print ""}'; }
for rep in 1 2; do
  $BUILD/copy_bw > $R/copy_bw-$rep.txt 2>&1; tail -4 $R/copy_bw-$rep.txt
  big rs-$rep reduce_scatter
done
el "perf"
for skip in 3 16; do
  timeout 90 ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read.sum -k regex:fanout --launch-skip $skip -c 1 $BUILD/fanout_bw 8 256 > $R/ncu-fanout-$skip.txt 2>&1; echo "ncu skip $skip rc=$?"
  grep -E "fanout|dram__|gpu__time|lts__|==PROF==|Error|ERR" $R/ncu-fanout-$skip.txt | head -12
done
el "ncu"
OUTP=$R/cmp16
timeout 240 bench/compare_ompi.sh -np 2,4 --sizes 8:16K --factor 2 --repeat 3 --colls all_reduce,broadcast --no-build --ferroccl-bench $PWD/.dev/bin/ferroccl-bench --timeout 60 --out $OUTP > $R/cmp16.txt 2>&1; echo "compare_ompi rc=$?"
grep -E "^\| +[0-9]+ \| (all_reduce|broadcast)" $OUTP.md | head -20
el "compare"
cd $OUT && tar czf r.tgz r && rm -rf r
