#!/usr/bin/env bash
# Round 39 (build 1f8be3c): (1) staged_bw with a cache-cold host column: is the staged path's gap
# below 64 MiB the host benchmark's buffers sitting in the last level cache? (2) issue 14's
# 8-rank all_gather, reduce_scatter, broadcast at 256 MiB-1 GiB (never recorded) and all_reduce;
# (3) 8 B all_reduce at 2 and 4 ranks next to NCCL at 1 rank, three alternations; (4) 16-rank
# all_reduce, 91b60c3 against this build, two more alternations.
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
lscpu > $R/lscpu.txt; grep -E "Model name|L1d|L2|L3|NUMA node" $R/lscpu.txt
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
st() { local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x FERROCCL_BENCH_PSK $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v NCCL | tail -10; }
unset FERROCCL_BENCH_PSK
st plain-1 1 256
wait
el "built + staged 1"
F=$BUILD/f; N=$BUILD/n
run() { # label np bin args
  local l=$1 np=$2 b=$3; shift 3
  timeout 150 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
  grep -E '^ +[0-9]+ ' $R/$l.log | awk '{print "   ", $1, "oop", $6, "us", $8, "GB/s; ip", $10, "us", $12, "GB/s"}'
}
export LD_LIBRARY_PATH=$PFX/lib
for c in all_gather reduce_scatter broadcast all_reduce; do
  run $c-np8 8 $F/${c}_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
done
el "np8 large"
for rep in 1 2 3; do
  LD_LIBRARY_PATH= run nccl-np1-$rep 1 $N/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
  run fer-np2-$rep 2 $F/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
  run fer-np4-$rep 4 $F/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
done
el "latency"
st plain-2 1 256
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round39
st tls 1 256
unset FERROCCL_BENCH_PSK
el "staged 2 + tls"
OLD=$PWD/.dev/bin/ferroccl-bench-91b60c3 NEW=$PWD/.dev/bin/ferroccl-bench
b16() { local l=$1 bin=$2; shift 2
  LD_LIBRARY_PATH= timeout 60 mpirun -np 16 --bind-to none $bin "$@" > $R/np16-$l.txt 2>&1
  echo "np16 $l rc=$? $(awk '$1 ~ /^[0-9]+$/ {printf "%s:%s ", $1, $6}' $R/np16-$l.txt)"; }
for rep in 3 4; do
  b16 ar-old-$rep $OLD all_reduce -b 8 -e 8K -f 4 -n 1000 -w 100
  b16 ar-new-$rep $NEW all_reduce -b 8 -e 8K -f 4 -n 1000 -w 100
  b16 arL-old-$rep $OLD all_reduce -b 512K -e 2M -f 4 -n 100 -w 10
  b16 arL-new-$rep $NEW all_reduce -b 512K -e 2M -f 4 -n 100 -w 10
done
el "np16"
cd $OUT && tar czf r.tgz r && rm -rf r
