#!/usr/bin/env bash
# Round 48: fanout_bw with three more references: P destinations written without a read
# (write-only), 64 KiB tiles per block, and P separate device copies; P = 8, 4, 2.
set -u
BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
GEN="-gencode=arch=compute_90,code=sm_90"
nvcc -O2 $GEN bench/gpu/fanout_bw.cu -o $BUILD/fanout_bw > $R/fanout_build.txt 2>&1; echo "fanout_bw build rc=$?"; head -5 $R/fanout_build.txt
for rep in 1 2; do $BUILD/fanout_bw 8 256 1024 > $R/fanout-p8-$rep.txt 2>&1; cat $R/fanout-p8-$rep.txt; done
$BUILD/fanout_bw 4 256 1024 > $R/fanout-p4.txt 2>&1; cat $R/fanout-p4.txt
$BUILD/fanout_bw 2 256 > $R/fanout-p2.txt 2>&1; cat $R/fanout-p2.txt
timeout 60 ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum -k regex:write_only -c 1 --launch-skip 3 $BUILD/fanout_bw 8 256 > $R/ncu-wonly.txt 2>&1; echo "ncu rc=$?"
grep -E "fanout|dram__|gpu__time|Error|ERR" $R/ncu-wonly.txt | head -8
cd $OUT && tar czf r.tgz r && rm -rf r
