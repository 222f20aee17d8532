#!/usr/bin/env bash
# Round 125 (device machine, 2026-12-06): a group's folds in batch launches (issue 14: "aggregation
# of a group into one launch"). ptxas report of the batch kernels (is the parameter block read in
# place?), GPU tests (with the batched-group test), grouped correctness with -m 8 (six
# collectives, 1, 2 and 4 ranks), grouped latency before (.dev/prefix-prev) / after / NCCL 2.28 at
# 1, 2 and 4 ranks in two alternations, and the staged path with TLS at 16-256 MiB with its floor
# column (issue 14).
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }  # phases that would not finish in time are skipped
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
for t in f32; do
  nvcc -cubin -arch=sm_90 -Xptxas -v --fmad=false --ftz=false --prec-div=true -std=c++17 -DFERROCCL_ONE_TYPE -DFERROCCL_TYPE_$t \
    -x cu src/cuda/kernels.cu -o $BUILD/k-$t.cubin > $R/ptxas-$t.txt 2>&1
  echo "ptxas $t rc=$?"; grep -A2 "_${t}_sum'" $R/ptxas-$t.txt | grep -E "Compiling|Used|stack"
done
( make -C $SRC -j8 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "ferroccl build rc=$?" ) &
( make -C $SRC -j4 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix-prev NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/p >$BUILD/p.log 2>&1; echo "prev build rc=$?" ) &
( make -C $SRC -j4 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl build rc=$?" ) &
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1 &
timeout 200 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
timeout 60 .dev/it cuda_kernels --test-threads 1 --nocapture > $R/kernels.txt 2>&1; el "kernels rc=$?"
grep -E "built and loaded|batched|test result" $R/kernels.txt
wait
el "builds"
F=$BUILD/f; P=$BUILD/p; N=$BUILD/n
run() { # label lib np bin args
  local l=$1 lib=$2 np=$3 b=$4; shift 4
  timeout 90 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$lib $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -E '^ +8 ' $R/$l.log | head -1 | awk '{print "8B oop", $6, "us ip", $10, "us"}')"
}
# Grouped correctness: 8 operations per group, every size checked.
for np in 1 2 4; do for t in all_reduce reduce_scatter all_gather broadcast reduce alltoall; do
  run chk-$t-np$np $PWD/.dev/prefix/lib $np $F/${t}_perf -b 8 -e 4M -f 8 -m 8 -c 1 -n 2 -w 1
done; done
run chk-ar-types-np2 $PWD/.dev/prefix/lib 2 $F/all_reduce_perf -b 8 -e 64K -f 8 -m 8 -d all -o all -c 1 -n 1 -w 1
el "grouped correctness"
for rep in 1 2; do
  before 330 || { el "latency rep $rep skipped (time)"; break; }
  for m in 8 1; do
    run nccl-np1-m$m-$rep "" 1 $N/all_reduce_perf -b 8 -e 8 -m $m -c 1 -n 300 -w 30
    for np in 1 2 4; do
      run prev-np$np-m$m-$rep $PWD/.dev/prefix-prev/lib $np $P/all_reduce_perf -b 8 -e 8 -m $m -c 1 -n 300 -w 30
      run new-np$np-m$m-$rep $PWD/.dev/prefix/lib $np $F/all_reduce_perf -b 8 -e 8 -m $m -c 1 -n 300 -w 30
    done
  done
  run nccl-ag-np1-m8-$rep "" 1 $N/all_gather_perf -b 8 -e 8 -m 8 -c 1 -n 300 -w 30
  run prev-ag-np2-m8-$rep $PWD/.dev/prefix-prev/lib 2 $P/all_gather_perf -b 16 -e 16 -m 8 -c 1 -n 300 -w 30
  run new-ag-np2-m8-$rep $PWD/.dev/prefix/lib 2 $F/all_gather_perf -b 16 -e 16 -m 8 -c 1 -n 300 -w 30
done
el "grouped latency"
st() { # label args
  local l=$1; shift
  timeout 150 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x FERROCCL_BENCH_PSK $BUILD/staged_bw "$@" > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -E "^#  |^ +[0-9]+ " $R/staged-$l.txt | tail -7
}
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round125
if before 420; then st tls-large 16 256; else el "staged skipped (time)"; fi
unset FERROCCL_BENCH_PSK
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
