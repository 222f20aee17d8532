#!/usr/bin/env bash
# Round 130 (device machine, 2026-12-06 evening): (1) GPU tests at 7479d84 (a7baecc's even cut
# of separate staged operations, not yet run on a GPU), concurrently with the builds.
# (2) issue 15: malloc'd buffers at 8 and 16 ranks go through the node area's slots in rounds
# of a slot's size (1 MiB): the root's copy in and the receivers' copies out follow each other.
# Smaller rounds let them overlap (two slots per rank). Sweep FERROCCL_NODE_SLOT_SIZE (rounds)
# 1M (default) / 256K / 64K for broadcast, all-reduce and all-gather at 32 KiB-2 MiB, next to
# ncclMemAlloc buffers and Open MPI, two alternations; inputs rewritten before every call
# (--fresh-inputs: what is left of the gap with new data each call is the copy into the slot).
# (3) the even cut on the GPU: staged nccl-tests at 35/70/140 MB (uneven pieces) 2 and 3 ranks, and staged_bw plaintext / TLS alternating.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1 &
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"; grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
wait
el "builds"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, collective, program and its arguments
  local l=$1 np=$2 c=$3; shift 3
  printf "%-6s np%-2s %-10s " $l $np $c
  timeout 60 mpirun -np $np --bind-to none "$@" -b 32K -e 2M -f 4 -n 200 -w 20 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2; do for np in 8 16; do for c in broadcast all_reduce all_gather; do
  before 250 || break 3
  line s1m $np $c $B $c --fresh-inputs
  line s256k $np $c -x FERROCCL_NODE_SLOT_SIZE=256K $B $c --fresh-inputs
  line s64k $np $c -x FERROCCL_NODE_SLOT_SIZE=64K $B $c --fresh-inputs
  line nccl $np $c $B $c --alloc nccl --fresh-inputs
  [ $i = 1 ] && line ompi $np $c /tmp/ompi_bench -C $c
done; done; done 2>&1 | tee $R/slot-rounds.txt
el "slot rounds"
F=$BUILD/f
for np in 2 3; do for t in all_reduce broadcast reduce; do
  [ $np = 3 ] && [ $t != all_reduce ] && continue
  before 300 || break 2
  timeout 60 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo \
    $F/${t}_perf -b 35000000 -e 140000000 -f 2 -c 1 -n 2 -w 1 > $R/staged-chk-$t-np$np.log 2>&1
  echo "staged-chk-$t-np$np rc=$? $(grep -E 'Out of bounds' $R/staged-chk-$t-np$np.log | awk '{print $(NF-1), $NF}')"
done; done
el "staged correctness"
st() { # label
  local l=$1
  timeout 90 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo ${PSK:+-x FERROCCL_BENCH_PSK=$PSK} $BUILD/staged_bw 16 128 > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -E "^ +[0-9]+ " $R/staged-$l.txt
}
echo "#      bytes     host     cold    floor   device  r-host  r-cold r-floor     host     cold    floor   device   copies"
for i in 1 2; do
  PSK=0123456789abcdef0123456789abcdef-round130; before 330 && st tls-$i
  PSK=; before 360 && st plain-$i
done
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
