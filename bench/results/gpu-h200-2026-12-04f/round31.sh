#!/usr/bin/env bash
# Round 31 (build 560c1aa + early hand-over to the worker): GPU tests, nccl-tests correctness on
# the staged path (shared memory and sockets, up to 128 MiB so the separate-piece path runs
# too), staged_bw before (.dev/prefix-b: separate pieces from 2 MiB, 1 MiB pieces) against
# after, three alternations, plaintext; one alternation with TLS.
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
wait
el "built + it"
F=$BUILD/f
chk() { # label np env... -- bin args
  local l=$1 np=$2; shift 2
  timeout 150 mpirun -np $np --bind-to none -x LD_LIBRARY_PATH -x NCCL_TESTS_DEVICE=0 "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
}
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
chk ar-np2-shm 2 -x NCCL_P2P_DISABLE=1 $F/all_reduce_perf -b 8 -e 128M -f 4 -d all -o all -c 1 -n 1 -w 1
chk ar-np3-sock 3 $SOCK $F/all_reduce_perf -b 8 -e 128M -f 4 -d float,half,bfloat16 -o sum,max,avg -c 1 -n 1 -w 1
for c in broadcast reduce all_gather reduce_scatter sendrecv alltoall; do
  chk $c-np2-sock 2 $SOCK $F/${c}_perf -b 8 -e 128M -f 4 -c 1 -n 1 -w 1
done
el "correctness"
st() { # label libdir args
  local l=$1 lib=$2; shift 2
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$lib $SOCK -x FERROCCL_BENCH_PSK $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -v "^\[" $R/staged-$l.txt | tail -9
}
B=$PWD/.dev/prefix-b/lib
unset FERROCCL_BENCH_PSK
for rep in 1 2 3; do st before-$rep $B 1 256; st after-$rep $PFX/lib 1 256; done
el "plain"
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round31
st tls-before $B 1 256; st tls-after $PFX/lib 1 256
el "tls"
cd $OUT && tar czf r.tgz r && rm -rf r
