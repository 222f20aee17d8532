#!/usr/bin/env bash
# Round 127 (device machine, 2026-12-06): a094982 (batch review fixes) on the GPU: GPU tests and
# grouped nccl-tests correctness (-m 8, six collectives, 1, 2 and 4 ranks); then the staged path
# at 16-128 MiB, plaintext and TLS, with separate-operation pieces from 32 MiB (the default) against
# one piecewise operation up to 128 MiB (FERROCCL_STAGE_SEPARATE_MIN=256M), alternated twice: is
# the 32-64 MiB TLS gap below the floor (round 125) the separate operations?
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
( make -C $SRC -j8 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl build rc=$?" ) &
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1 &
timeout 200 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
wait
el "builds"
F=$BUILD/f
run() { # label lib np bin args
  local l=$1 lib=$2 np=$3 b=$4; shift 4
  timeout 60 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$lib $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}')"
}
for np in 1 2 4; do for t in all_reduce reduce_scatter all_gather broadcast reduce alltoall; do
  run chk-$t-np$np $PWD/.dev/prefix/lib $np $F/${t}_perf -b 8 -e 4M -f 8 -m 8 -c 1 -n 2 -w 1
done; done
el "grouped correctness"
st() { # label separate_min args
  local l=$1 sep=$2; shift 2
  timeout 120 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_STAGE_SEPARATE_MIN=$sep ${PSK:+-x FERROCCL_BENCH_PSK=$PSK} $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -E "^ +[0-9]+ " $R/staged-$l.txt
}
echo "#      bytes     host     cold    floor   device  r-host  r-cold r-floor     host     cold    floor   device   copies"
for rep in 1 2; do
  for mode in tls plain; do
    if [ $mode = tls ]; then PSK=0123456789abcdef0123456789abcdef-round127; else PSK=; fi
    before 520 || { el "staged $rep $mode skipped (time)"; break 2; }
    st $mode-sep32-$rep 32M 16 128
    before 540 || { el "staged $rep $mode sep256 skipped (time)"; break 2; }
    st $mode-sep256-$rep 256M 16 128
  done
done
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
