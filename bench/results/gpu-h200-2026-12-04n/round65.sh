#!/usr/bin/env bash
# Round 65 (one H200): where an 8-byte device sendrecv's 18.5 us go. Nsight Systems on both
# ranks of `sendrecv_perf -b 8 -e 8 -n 2000` (CUDA API and OS runtime traces, summary tables),
# and the same run plain for its time.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
which nsys || ls /usr/local/cuda/bin | grep -i nsys
make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?"
F=$BUILD/f
timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib $F/sendrecv_perf -b 8 -e 8 -n 2000 -w 100 > $R/plain.log 2>&1
echo "plain rc=$? $(grep -E '^ +8 ' $R/plain.log)"
NSYS=$(which nsys || echo /usr/local/cuda/bin/nsys)
timeout 200 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib $NSYS profile -t cuda,osrt --stats=true -o $BUILD/sr-%q{OMPI_COMM_WORLD_RANK} --force-overwrite true $F/sendrecv_perf -b 8 -e 8 -n 2000 -w 100 > $R/nsys.log 2>&1
echo "nsys rc=$?"
grep -E "^ +8 " $R/nsys.log
grep -A25 "cuda_api_sum" $R/nsys.log | head -60
grep -A20 "osrt_sum" $R/nsys.log | head -45
el done
cd $OUT && tar czf r.tgz r && rm -rf r
