#!/usr/bin/env bash
# Round 47: can a one-to-P copy on one GPU get closer to the copy bandwidth? fanout_bw with two
# new variants (destination order rotated per block; phased: source chunks copied to one
# destination at a time, re-read from L2), with and without destinations skewed in address;
# Nsight Compute DRAM counters of the 8 MiB phased variant at P = 8, 256 MiB.
set -u
T0=$(date +%s)
BUILD=/tmp/b; R=$OUT/r; mkdir -p $R $BUILD
GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvcc -O2 $GEN bench/gpu/fanout_bw.cu -o $BUILD/fanout_bw > $R/fanout_build.txt 2>&1; echo "fanout_bw build rc=$?"; head -5 $R/fanout_build.txt
for rep in 1 2; do
  FANOUT_SKEW_BYTES=0 $BUILD/fanout_bw 8 256 512 1024 > $R/fanout-p8-$rep.txt 2>&1; cat $R/fanout-p8-$rep.txt
  FANOUT_SKEW_BYTES=69632 $BUILD/fanout_bw 8 256 1024 > $R/fanout-p8-skew-$rep.txt 2>&1; cat $R/fanout-p8-skew-$rep.txt
done
$BUILD/fanout_bw 4 256 1024 > $R/fanout-p4.txt 2>&1; cat $R/fanout-p4.txt
$BUILD/fanout_bw 2 256 1024 > $R/fanout-p2.txt 2>&1; cat $R/fanout-p2.txt
el "fanout"
for skip in 81 68; do
  timeout 90 ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum -k regex:fanout --launch-skip $skip -c 1 $BUILD/fanout_bw 8 256 > $R/ncu-fanout-$skip.txt 2>&1; echo "ncu skip $skip rc=$?"
  grep -E "fanout|dram__|gpu__time|lts__|Error|ERR" $R/ncu-fanout-$skip.txt | head -12
done
el "ncu"
cd $OUT && tar czf r.tgz r && rm -rf r
