#!/usr/bin/env bash
# Round 45: round 44's gather_perf at 4 ranks timed out (nccl-tests built against a 2.27 header
# runs gather as grouped ncclSend/ncclRecv, i.e. the staged path, not the new grouped copy).
# Find the size and the waiting ranks: this build and c613ad8, with FERROCCL_TIMEOUT.
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; OLD=$PWD/.dev/prefix-old; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
make -C $SRC/src -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f $BUILD/f/gather_perf $BUILD/f/sendrecv_perf > $BUILD/f.log 2>&1; echo "build rc=$?"; tail -3 $BUILD/f.log
el "built"
F=$BUILD/f
run() { local l=$1 t=$2 np=$3 lib=$4; shift 4
  timeout $t mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$lib -x NCCL_DEBUG=WARN -x FERROCCL_TIMEOUT=15 "$@" > $R/$l.log 2>&1
  echo "== $l rc=$?"; grep -E '^ +[0-9]+ ' $R/$l.log | awk '{printf "%s:%s ", $1, $9} END {print ""}'; grep -iE "warn|error|timeout|waiting" $R/$l.log | sort | uniq -c | head -6; }
run gather-new 45 4 $PFX/lib $F/gather_perf -b 8 -e 256M -f 4 -c 1 -n 1 -w 0
run gather-old 45 4 $OLD/lib $F/gather_perf -b 8 -e 256M -f 4 -c 1 -n 1 -w 0
run sendrecv-new 30 2 $PFX/lib $F/sendrecv_perf -b 8 -e 64M -f 4 -c 1 -n 1 -w 0
el "done"
cd $OUT && tar czf r.tgz r && rm -rf r
