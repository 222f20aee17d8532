#!/usr/bin/env bash
# Builds NVIDIA's nccl-tests (unchanged, from a source tree beside the project) against an
# installed ferroccl prefix and runs them on the GPU machine. Prints a table of #wrong and
# timings last; full logs go to $OUT (the device tool's output folder) or ./nccl-tests-out.
#   bench/gpu/nccl_tests.sh PREFIX NCCL_TESTS_SRC MODE
#   MODE: smoke | matrix | perf | compare        (see the case below)
#   compare: nccl-tests built against the NCCL installed on the machine too (NCCL_REF_HOME, or
#   found with ldconfig), 1 rank side by side, ferroccl at 2 and 4 ranks sharing the GPU, and
#   the device-to-device copy bandwidth (bench/gpu/copy_bw.cu) measured in the same run.
set -u
PREFIX=$(cd "$1" && pwd) SRC=$(cd "$2" && pwd) MODE=${3:-smoke}
OUT=${OUT:-$PWD/nccl-tests-out}
BUILD=${BUILD:-/tmp/nccl-tests-build}
mkdir -p "$OUT" "$BUILD"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0
MPI_HOME=${MPI_HOME:-/usr/lib/x86_64-linux-gnu/openmpi}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
GENCODE="-gencode=arch=compute_90,code=sm_90"
summary=()

build() { # name nccl_home
  local name=$1 home=$2
  if [ -x "$BUILD/$name/all_reduce_perf" ]; then return 0; fi
  echo "== building nccl-tests against $name ($home)"
  if ! make -C "$SRC" -j16 MPI=1 MPI_HOME="$MPI_HOME" CUDA_HOME="$CUDA_HOME" NCCL_HOME="$home" \
      NVCC_GENCODE="$GENCODE" BUILDDIR="$BUILD/$name" >"$BUILD/$name.log" 2>&1; then
    echo "BUILD FAILED against $name:"; grep -m20 -E "error|Error" "$BUILD/$name.log"; tail -5 "$BUILD/$name.log"
    return 1
  fi
}

run() { # label np timeout_s binary args...
  local label=$1 np=$2 t=$3 bin=$4
  shift 4
  local log="$OUT/$label.log"
  echo "== $label: np=$np $bin $*"
  timeout "$t" mpirun -np "$np" --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_P2P_DISABLE \
    -x FERROCCL_TIMEOUT -x NCCL_NVLS_ENABLE "$bin" "$@" >"$log" 2>&1
  local rc=$?
  local wrong bw
  wrong=$(grep -E "Out of bounds values" "$log" | awk '{print $NF, $(NF-1)}' | head -1)
  bw=$(grep -E "Avg bus bandwidth" "$log" | awk '{print $NF}')
  summary+=("$(printf '%-40s rc=%-3s %-22s avg busbw %s' "$label" "$rc" "${wrong:-no-footer}" "${bw:--}")")
  echo "${summary[-1]}" >>"$OUT/summary.txt"
  grep -E "^ +[0-9]+ " "$log" | tail -n 4
  [ $rc -eq 0 ] || { echo "   (rc $rc) last lines:"; tail -n 15 "$log"; }
}

nvidia-smi -L
build ferroccl "$PREFIX" || exit 1
B=$BUILD/ferroccl
export LD_LIBRARY_PATH=$PREFIX/lib:${LD_LIBRARY_PATH:-}
case "$MODE" in
  smoke)
    run ar-np1 1 60 "$B/all_reduce_perf" -b 8 -e 8M -f 8 -c 1 -n 5 -w 1
    run ar-np2 2 60 "$B/all_reduce_perf" -b 8 -e 8M -f 8 -c 1 -n 5 -w 1
    run ag-np2 2 60 "$B/all_gather_perf" -b 8 -e 8M -f 8 -c 1 -n 5 -w 1
    run sr-np2 2 60 "$B/sendrecv_perf" -b 8 -e 8M -f 8 -c 1 -n 5 -w 1
    run ar-np4 4 60 "$B/all_reduce_perf" -b 8 -e 8M -f 8 -c 1 -n 5 -w 1 -d all -o all
    ;;
  matrix)
    for np in ${NPS:-1 2 4}; do
      for t in ${TESTS:-all_reduce all_gather broadcast reduce reduce_scatter alltoall sendrecv gather scatter hypercube}; do
        run "$t-np$np" "$np" 120 "$B/${t}_perf" -b 8 -e ${MAXB:-1M} -f 32 -d all -o all -c 1 -n ${ITERS:-2} -w 1
      done
    done
    ;;
  perf)
    for np in ${NPS:-1 2 4}; do
      run "perf-ar-np$np" "$np" 240 "$B/all_reduce_perf" -b 8 -e 1G -f 8 -c 1 -n 20 -w 5
    done
    ;;
  compare)
    here=$(cd "$(dirname "$0")" && pwd)
    nvcc -O2 $GENCODE "$here/copy_bw.cu" -o "$BUILD/copy_bw" && "$BUILD/copy_bw" 1024 | tee "$OUT/copy_bw.log"
    ref=${NCCL_REF_HOME:-}
    if [ -z "$ref" ]; then
      lib=$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')
      [ -n "$lib" ] && ref=$(dirname "$(dirname "$lib")")
      [ -f "$ref/include/nccl.h" ] || ref=/usr
    fi
    echo "reference NCCL: $ref ($(ldconfig -p | grep -m1 libnccl.so.2))"
    if build nccl "$ref"; then
      R=$BUILD/nccl
      for t in ${TESTS:-all_reduce}; do
        LD_LIBRARY_PATH=${LD_LIBRARY_PATH#$PREFIX/lib:} run "nccl-$t-np1" 1 240 "$R/${t}_perf" -b 8 -e 1G -f 4 -c 1 -n 20 -w 5
        run "ferroccl-$t-np1" 1 240 "$B/${t}_perf" -b 8 -e 1G -f 4 -c 1 -n 20 -w 5
      done
    fi
    for np in ${NPS:-2 4}; do
      for t in ${TESTS:-all_reduce}; do
        run "ferroccl-$t-np$np" "$np" 300 "$B/${t}_perf" -b 8 -e 1G -f 4 -c 1 -n 10 -w 3
      done
    done
    ;;
esac
echo
echo "==== summary ($MODE)"
printf '%s\n' "${summary[@]}"
