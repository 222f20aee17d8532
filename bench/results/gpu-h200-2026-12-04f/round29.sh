#!/usr/bin/env bash
# Round 29: node-area fix (a node operation's output goes back only when it is done); where
# the piecewise staged path loses time from 32 MiB: TRACE of landed/released times; variant C
# (input piecewise, output copied back at the end) against before (b) and after.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j14 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl nccl-tests build rc=$?" ) &
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
export LD_LIBRARY_PATH=$PFX/lib
( timeout 200 .dev/it cuda:: --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda:: rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -20
st() { # label libdir args
  local l=$1 lib=$2; shift 2
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | grep -v "NCCL INFO\|NCCL TRACE" | tail -9
}
B=$PWD/.dev/prefix-b/lib; C=$PWD/.dev/prefix-c/lib
unset FERROCCL_BENCH_PSK
for rep in 1 2; do st before-$rep $B 1 256; st after-$rep $PFX/lib 1 256; st c-$rep $C 1 256; done
el "plain"
export NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL
NCCL_DEBUG_FILE=$R/trace-after.%h.%p st trace-after $PFX/lib 4 128
NCCL_DEBUG_FILE=$R/trace-c.%h.%p st trace-c $C 4 128
unset NCCL_DEBUG NCCL_DEBUG_SUBSYS
wait
el "traced"
F=$BUILD/f
chk() { # label np env... -- bin args
  local l=$1 np=$2; shift 2
  timeout 120 mpirun -np $np --bind-to none -x LD_LIBRARY_PATH -x NCCL_TESTS_DEVICE=0 "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
}
chk ar-np2-shm 2 -x NCCL_P2P_DISABLE=1 $F/all_reduce_perf -b 8 -e 64M -f 4 -d all -o all -c 1 -n 2 -w 1
chk ar-np3-shm 3 -x NCCL_P2P_DISABLE=1 $F/all_reduce_perf -b 256K -e 64M -f 4 -c 1 -n 2 -w 1
for c in broadcast reduce all_gather reduce_scatter sendrecv; do
  chk $c-np2-shm 2 -x NCCL_P2P_DISABLE=1 $F/${c}_perf -b 8 -e 32M -f 4 -c 1 -n 2 -w 1
done
el "correctness"
cd $OUT && tar czf r.tgz r && rm -rf r
