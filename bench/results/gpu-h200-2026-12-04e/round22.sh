#!/usr/bin/env bash
# Issue 14: the staged path's pieces as one gated group (FERROCCL_STAGE_PIECE sweep), the device
# path's per-call exchange as a node gather (GPU tests incl. the mixed-memory refusal), latency.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl build rc=$?" ) &
( make -C $SRC -j4 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl build rc=$?" ) &
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
export LD_LIBRARY_PATH=$PFX/lib
( timeout 200 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "^test |test result|panicked" $R/it-cuda.txt | head -20
for i in 1 2 3 4; do ( timeout 60 .dev/it cuda::device_scalar --test-threads 1 > $R/ds-$i.txt 2>&1; echo "device_scalar run $i rc=$?" ); done
wait
el "built + it"
F=$BUILD/f; N=$BUILD/n
lat() { # label np bin args
  local l=$1 np=$2 b=$3; shift 3
  timeout 150 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE -x FERROCCL_STAGE_PIECE $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -E '^ +8 ' $R/$l.log | head -1 | awk '{print "8B oop", $6, "us ip", $10, "us"}')"
}
for rep in 1 2 3; do
  LD_LIBRARY_PATH= lat nccl-np1-$rep 1 $N/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
  lat fer-np2-$rep 2 $F/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
  lat fer-np4-$rep 4 $F/all_reduce_perf -b 8 -e 8 -c 1 -n 500 -w 50
done
lat fer-np2-all 2 $F/all_reduce_perf -b 8 -e 16M -f 8 -d all -o all -c 1 -n 2 -w 1
export NCCL_P2P_DISABLE=1
lat staged-ar-np2 2 $F/all_reduce_perf -b 8 -e 64M -f 4 -d all -o all -c 1 -n 2 -w 1
lat staged-bc-np2 2 $F/broadcast_perf -b 8 -e 64M -f 4 -d float -c 1 -n 2 -w 1
lat staged-reduce-np2 2 $F/reduce_perf -b 8 -e 64M -f 4 -d float -o sum -c 1 -n 2 -w 1
lat staged-ar-np3 3 $F/all_reduce_perf -b 1M -e 64M -f 4 -c 1 -n 2 -w 1
FERROCCL_STAGE_PIECE=262144 lat staged-ar-np2-256k 2 $F/all_reduce_perf -b 1M -e 64M -f 4 -d float,half -c 1 -n 2 -w 1
unset NCCL_P2P_DISABLE
el "latency + staged matrix"
st() { # label args
  local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK -x FERROCCL_STAGE_PIECE $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | tail -9
}
unset FERROCCL_BENCH_PSK
for p in 1048576 262144 4194304; do FERROCCL_STAGE_PIECE=$p st plain-$p 1 256; done
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round22
st tls-1048576 1 256
FERROCCL_STAGE_PIECE=262144 st tls-262144 1 256
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
