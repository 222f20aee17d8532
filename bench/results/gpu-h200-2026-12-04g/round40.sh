#!/usr/bin/env bash
# Round 40 (1f8be3c + FERROCCL_STAGE_SEPARATE_MIN): (1) the device copy bandwidth and 8-rank
# all_gather / broadcast at 256 MiB-1 GiB in the same run (their ceilings); (2) 8 B latency:
# NCCL at 1 rank, the stream-ordering floor without ferroccl (flag_protocol) and ferroccl at 2
# and 4 ranks, three alternations; (3) staged_bw with cache-cold host and floor columns, the
# default (separate pieces from 32 MiB) against piecewise staging up to 64 MiB, alternating.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j10 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl nccl-tests build rc=$?" ) &
( make -C $SRC -j5 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl nccl-tests build rc=$?" ) &
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
nvcc -O2 $GEN bench/gpu/copy_bw.cu -o $BUILD/copy_bw > $R/copy_build.txt 2>&1; echo "copy_bw build rc=$?"
nvcc -O2 $GEN bench/gpu/flag_protocol.cu -I$MPI_HOME/include -L$MPI_HOME/lib -lcuda -lmpi -o $BUILD/flag_protocol > $R/flag_build.txt 2>&1; echo "flag_protocol build rc=$?"
wait
el "built"
F=$BUILD/f; N=$BUILD/n
run() { # label np bin args
  local l=$1 np=$2 b=$3; shift 3
  timeout 150 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
  grep -E '^ +[0-9]+ ' $R/$l.log | awk '{print "   ", $1, "oop", $6, "us", $8, "GB/s; ip", $10, "us", $12, "GB/s"}'
}
export LD_LIBRARY_PATH=$PFX/lib
$BUILD/copy_bw 1024 > $R/copy_bw-1.txt 2>&1; cat $R/copy_bw-1.txt
for rep in 1 2; do
  run all_gather-np8-$rep 8 $F/all_gather_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
  run broadcast-np8-$rep 8 $F/broadcast_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
done
$BUILD/copy_bw 1024 > $R/copy_bw-2.txt 2>&1; cat $R/copy_bw-2.txt
el "np8 large"
for rep in 1 2 3; do
  LD_LIBRARY_PATH= run nccl-np1-$rep 1 $N/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
  for np in 2 4; do
    timeout 60 mpirun -np $np --bind-to none $BUILD/flag_protocol 2000 > $R/floor-np$np-$rep.txt 2>&1; grep -v "^\[" $R/floor-np$np-$rep.txt | tail -4
    run fer-np$np-$rep $np $F/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
  done
done
el "latency"
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x FERROCCL_BENCH_PSK -x FERROCCL_STAGE_SEPARATE_MIN $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | tail -8; }
unset FERROCCL_BENCH_PSK
for rep in 1 2; do
  unset FERROCCL_STAGE_SEPARATE_MIN; st default-$rep 1 64
  export FERROCCL_STAGE_SEPARATE_MIN=128M; st piecewise-$rep 1 64
done
unset FERROCCL_STAGE_SEPARATE_MIN
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
