#!/usr/bin/env bash
# Round 151 (device machine, 2026-12-07, new session): round 150 never ran (device starts
# refused all session); this is round 150 on HEAD only (build b, .dev/prefix and .dev/it), with
# NCCL 2.28 itself beside the small staged calls over the same sockets. (1) GPU tests.
# (2) nccl-tests -G 10 -c 1 through the staged path (sockets). (3) graph replays against
# uncaptured calls, 256 KiB-64 MiB. (4) Why 8-512 B staged calls take 225-550 us: the hand-off's
# floor without ferroccl (bench/gpu/handoff_floor.cu, 1 and 2 processes), host buffers over
# the same sockets, NCCL over the same sockets, a TRACE timeline, and the same under MPS.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ echo "b $(cat .dev/build.commit)"; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?"
  nvcc -O2 -I$MPI_HOME/include bench/gpu/handoff_floor.cu -lcuda -L$MPI_HOME/lib -lmpi -o $BUILD/handoff_floor > $BUILD/floor.log 2>&1; echo "floor build rc=$?" ) &
timeout 200 .dev/it cuda --test-threads 1 --skip gpu_processes_staged > $R/gpu-tests-b.txt 2>&1; rc=$?; el "gpu tests b rc=$rc"
grep -E "^test result|FAILED|panicked" $R/gpu-tests-b.txt | head -20
wait
el "built"; tail -2 $BUILD/f.log; tail -3 $BUILD/floor.log
F=$BUILD/f
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
run() { # label np collective lib extra-args; returns nonzero on a failed run or a wrong value
  local l=$1 np=$2 t=$3 lib=$4; shift 4
  timeout 45 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/$lib/lib \
    $SOCK -x NCCL_DEBUG=WARN $F/${t}_perf "$@" > $R/$l-$t-np$np.log 2>&1
  local rc=$? wrong=$(awk '/^ +[0-9]+ /{w+=$9+$13} END{print w+0}' $R/$l-$t-np$np.log)
  echo "$l $t np$np rc=$rc $(grep -E 'Out of bounds' $R/$l-$t-np$np.log | awk '{print $(NF-1), $NF}') wrong=$wrong"
  [ $rc = 0 ] && [ "$wrong" = 0 ]
}
CHK="-b 8 -e 32M -f 8 -c 1 -n 5 -w 2"
for t in all_reduce all_gather reduce_scatter broadcast; do
  run graph 2 $t .dev/prefix $CHK -G 10
done
run graph 3 all_reduce .dev/prefix $CHK -G 10
run graph 3 reduce_scatter .dev/prefix -b 1M -e 33M -f 4 -c 1 -n 5 -w 2 -G 10
el "nccl-tests checks"
timeout 100 .dev/it cuda::gpu_processes_staged --test-threads 1 > $R/gpu-staged.txt 2>&1; el "staged gpu test rc=$?"
grep -E "^test |^test result|panicked" $R/gpu-staged.txt | head
# Replays against uncaptured calls.
T="-b 256K -e 64M -f 4 -c 0 -n 10 -w 3"
run rep1-b 2 all_reduce .dev/prefix $T -G 10
run plain-b 2 all_reduce .dev/prefix $T
el "replays"
# Small calls.
for b in 8 4096; do for np in 1 2; do
  timeout 20 mpirun -np $np --bind-to none $BUILD/handoff_floor $b 200 > $R/floor-$b-np$np.log 2>&1; echo "floor $b np$np rc=$? $(tail -1 $R/floor-$b-np$np.log)"
done; done
run small 2 all_reduce .dev/prefix -b 8 -e 64K -f 2 -c 0 -n 50 -w 10
# NCCL 2.28 itself (the system library: no LD_LIBRARY_PATH to the prefix) over the same sockets.
timeout 45 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 $SOCK -x NCCL_DEBUG=VERSION $F/all_reduce_perf -b 8 -e 64K -f 2 -c 0 -n 50 -w 10 > $R/nccl-small.log 2>&1; el "nccl small rc=$? $(grep -m1 'NCCL version' $R/nccl-small.log)"
timeout 45 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 $SOCK -x NCCL_DEBUG=WARN $F/all_reduce_perf -b 256K -e 64M -f 4 -c 0 -n 10 -w 3 > $R/nccl-mid.log 2>&1; el "nccl mid rc=$?"
timeout 30 mpirun -np 2 --bind-to none $SOCK .dev/fb all_reduce -b 8 -e 64K -f 2 -n 200 -w 20 > $R/host-small.log 2>&1; el "host small rc=$?"
timeout 30 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK \
  -x NCCL_DEBUG=TRACE -x NCCL_DEBUG_SUBSYS=COLL $F/all_reduce_perf -b 8 -e 4096 -f 8 -c 0 -n 20 -w 3 > $R/small-trace.log 2>&1; el "trace rc=$?"
for f in small-all_reduce-np2 nccl-small host-small rep1-b-all_reduce-np2 plain-b-all_reduce-np2 nccl-mid; do
  echo "== $f"; grep -E "^ +[0-9]+ |WARN" $R/$f.log | awk '{print $1, $6, $10}' | head -20 | tr '\n' ';'; echo
done
grep -c "staged job" $R/small-trace.log
# Under MPS (one GPU context for both processes), if time is left: does the hand-off floor of
# two processes, and the small staged calls, come down to one process's?
if [ $(( $(date +%s) - T0 )) -lt 440 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d; echo "mps up rc=$?"
  for b in 8 4096; do
    timeout 20 mpirun -np 2 --bind-to none -x CUDA_MPS_PIPE_DIRECTORY $BUILD/handoff_floor $b 200 > $R/floor-$b-np2-mps.log 2>&1; echo "floor mps $b np2 rc=$? $(tail -1 $R/floor-$b-np2-mps.log)"
  done
  timeout 30 mpirun -np 2 --bind-to none -x CUDA_MPS_PIPE_DIRECTORY -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK \
    -x NCCL_DEBUG=WARN $F/all_reduce_perf -b 8 -e 64K -f 2 -c 0 -n 50 -w 10 > $R/small-mps.log 2>&1; el "small mps rc=$?"
  timeout 45 mpirun -np 2 --bind-to none -x CUDA_MPS_PIPE_DIRECTORY -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK \
    -x NCCL_DEBUG=WARN $F/all_reduce_perf -b 1M -e 64M -f 4 -c 0 -n 10 -w 3 > $R/mid-mps.log 2>&1; el "mid mps rc=$?"
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  timeout 45 mpirun -np 2 --bind-to none $SOCK .dev/fb all_reduce -b 1M -e 64M -f 4 -n 10 -w 3 > $R/host-mid.log 2>&1; el "host mid rc=$?"
  for f in small-mps mid-mps host-mid; do echo "== $f"; grep -E "^ +[0-9]+ |WARN" $R/$f.log | awk '{print $1, $6, $10}' | head -20 | tr '\n' ';'; echo; done
fi
cd $OUT && tar czf r.tgz r && rm -rf r
