#!/usr/bin/env bash
# Round 128 (device machine, 2026-12-06): what holds the staged path's separate-operation pieces
# (32 MiB and up) below the floor at 32-64 MiB (rounds 125 and 127)? Two ranks as processes share
# the one GPU here, so each rank's copies and flag waits time-slice with the other's context.
# Three variants, plaintext and TLS, alternated twice: the default (16 pieces of 2-8 MiB), fewer
# larger pieces (FERROCCL_STAGE_PIECE=8M: 32 MiB as 4 pieces of 8 MiB), and the default under MPS
# (one GPU context server for both processes, so their copies and waits no longer time-slice).
# First the 2-rank broadcast of 8-32 B with and without the driver's context query per buffer
# (issue 15). Then 2-rank all-reduce against Open MPI at 1-8 MiB on the 16-core host (issue 15: 1 MiB kernel-
# copy pieces for two ranks, measured so far only on the AMD 2-core VM).
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u; which nvidia-cuda-mps-control; } > $R/host.txt 2>&1
cat $R/host.txt
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1
el "build rc=$?"
st() { # label min max extra-mpirun-args...
  local l=$1 lo=$2 hi=$3; shift 3
  timeout 120 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo ${PSK:+-x FERROCCL_BENCH_PSK=$PSK} "$@" $BUILD/staged_bw $lo $hi > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -E "^ +[0-9]+ " $R/staged-$l.txt
}
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d && sleep 1 && echo "mps on"
}
mps_off() { echo quit | nvidia-cuda-mps-control; sleep 1; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; echo "mps off"; }
# Issue 15: the 2-rank broadcast of 8-32 B on this host. With a CUDA driver present every host-
# buffer call asked the driver for the thread's context once per buffer; ferroccl-bench-fix asks
# once per call, FERROCCL_CUDA_DISABLE=1 never. Alternating three times with Open MPI.
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, collective, program and its arguments
  local l=$1 np=$2 c=$3; shift 3
  printf "%-6s np%-2s %-10s " $l $np $c
  timeout 60 mpirun -np $np --bind-to none "$@" -b 8 -e 512 -f 4 -n 100000 -w 1000 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2 3; do for c in broadcast all_reduce; do
  line base 2 $c $B $c
  line fix 2 $c $B-fix $c
  line nocuda 2 $c -x FERROCCL_CUDA_DISABLE=1 $B $c
  line ompi 2 $c /tmp/ompi_bench -C $c
done; done 2>&1 | tee $R/np2-small.txt
el "small calls"
# The timeline of a 32 MiB TLS call's 16 separate operations (each job's inputs ready, engine
# time, streams released; NCCL_DEBUG=TRACE), to see whether the time between them is the engine
# or waiting for the GPU.
NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=$R/trace-tls32.%h.%p timeout 60 mpirun -np 2 --bind-to none \
  -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo \
  -x FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round128 -x STAGED_BW_DETAIL=1 \
  -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw 32 32 > $R/staged-trace-tls32.txt 2>&1
el "trace rc=$?"; grep -E "^ +[0-9]+ " $R/staged-trace-tls32.txt; gzip $R/trace-tls32.*
echo "#      bytes     host     cold    floor   device  r-host  r-cold r-floor     host     cold    floor   device   copies"
for rep in 1 2; do
  for mode in tls plain; do
    if [ $mode = tls ]; then PSK=0123456789abcdef0123456789abcdef-round128; else PSK=; fi
    before 230 || { el "staged $rep $mode skipped (time)"; break 2; }
    st $mode-default-$rep 16 128
    st $mode-piece8M-$rep 32 128 -x FERROCCL_STAGE_PIECE=8M
    if which nvidia-cuda-mps-control >/dev/null 2>&1 && mps_on; then
      st $mode-mps-$rep 16 128 -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY
      mps_off
    fi
  done
done
el "staged"
PSK=
if before 290; then
  timeout 110 bench/compare_ompi.sh -np 2 --colls all_reduce --sizes 512K:16M --factor 2 --repeat 2 \
    --no-build --ferroccl-bench $PWD/.dev/bin/ferroccl-bench --out $R/np2-ar > $R/compare.log 2>&1
  el "compare rc=$?"; grep -E "^\|" $R/np2-ar.md | head -20
fi
cd $OUT && tar czf r.tgz r && rm -rf r
