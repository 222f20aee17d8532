#!/usr/bin/env bash
# Round 77 (issue 18), READY for a session lent nvidia-h200-x4 or -x8 (or -x2): nccl-tests
# built against NCCL as installed and against ferroccl, one process per GPU under mpirun on
# every GPU of the machine, all_reduce, all_gather, reduce_scatter, broadcast, sendrecv and
# alltoall from 8 B to 8 GiB (factor 4, data checked on one call per size), ferroccl and NCCL
# alternating; then the side-by-side tables (bench/gpu/nccl_tests_compare.py: busbw ratio per
# size, >= 0.9x from 64 MiB, <= 1.5x NCCL's 8 B time, #wrong 0), the GPU tests, and one process
# driving every GPU (nccl-tests -g N: sends and receives by address between its ranks).
# Carry .dev (prefix from `make install PREFIX=$PWD/.dev/prefix TLS_BACKEND=OPENSSL3 MPI=1`,
# static libraries removed; .dev/nccl-tests the source; .dev/it the GPU test binary).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=60
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
NG=$(nvidia-smi -L | grep -c '^GPU'); E=${E:-8G}
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
echo "GPUs: $NG; build $(cat .dev/build.commit)"; nvidia-smi topo -m > $R/topo.txt 2>&1
( make -C $SRC -j30 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests (ferroccl) build rc=$?" ) &
( make -C $SRC -j30 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=/usr NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/n >$BUILD/n.log 2>&1; echo "nccl-tests (NCCL) build rc=$?" ) &
wait
el built
F=$BUILD/f N=$BUILD/n
run() { # label lib binary args...
  local l=$1 lib=$2 b=$3; shift 3
  timeout 90 mpirun -np $NG --bind-to none -x LD_LIBRARY_PATH=$lib -x NCCL_NVLS_ENABLE -x FERROCCL_TIMEOUT $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/$l.log | sort -u | tr '\n' ' ')$(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}')"
}
for c in all_reduce all_gather reduce_scatter broadcast sendrecv alltoall; do
  run ferroccl-$c $PFX/lib $F/${c}_perf -b 8 -e $E -f 4 -c 1 -n 10 -w 3
  run nccl-$c /usr/lib/x86_64-linux-gnu $N/${c}_perf -b 8 -e $E -f 4 -c 1 -n 10 -w 3
  el $c
done
for c in all_reduce all_gather reduce_scatter broadcast sendrecv alltoall; do
  python3 bench/gpu/nccl_tests_compare.py $R/ferroccl-$c.log $R/nccl-$c.log --title "$c, $NG GPUs" >> $R/compare.md 2>&1
  echo >> $R/compare.md
done
grep -E "^### |^- (busbw|latency|ferroccl #wrong)" $R/compare.md
# One process driving every GPU (-g N), sends and receives between its ranks by address.
for c in sendrecv all_reduce; do
  timeout 60 mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_NVLS_ENABLE -x FERROCCL_TIMEOUT -x NCCL_DEBUG=INFO \
    -x NCCL_DEBUG_SUBSYS=P2P $F/${c}_perf -b 8 -e 1G -f 8 -c 1 -n 10 -w 3 -g $NG > $R/ferroccl-$c-g.log 2>&1
  echo "ferroccl $c -g $NG rc=$? direct=$(grep -c 'P2P/direct' $R/ferroccl-$c-g.log) wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9}' $R/ferroccl-$c-g.log | sort -u | tr '\n' ' ')"
  timeout 60 mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu -x NCCL_NVLS_ENABLE \
    $N/${c}_perf -b 8 -e 1G -f 8 -c 1 -n 10 -w 3 -g $NG > $R/nccl-$c-g.log 2>&1
  python3 bench/gpu/nccl_tests_compare.py $R/ferroccl-$c-g.log $R/nccl-$c-g.log --title "$c, one process, -g $NG" >> $R/compare.md 2>&1
done
el "one process"
LD_LIBRARY_PATH=$PFX/lib timeout 150 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?"
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -10
el done
cd $OUT && tar czf r.tgz r && rm -rf r
