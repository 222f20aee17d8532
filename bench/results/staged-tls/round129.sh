#!/usr/bin/env bash
# Round 129 (device machine, 2026-12-06): (1) issue 15: round 128 measured the 2-rank all-reduce
# of malloc'd buffers at 512 KiB-16 MiB at about half round 116's speed on this kind of host;
# since then two ranks take 1 MiB kernel-copy pieces (node::remote_piece, tuned on the AMD 2-core
# VM). ferroccl-bench with 1 MiB pieces (HEAD) against 256 KiB (ferroccl-bench-p256k) and Open MPI,
# alternating three times. (2) b2cc23e: separate staged operations of at least 8 MiB: nccl-tests
# through the staged path over sockets at 50 and 100 MB (uneven last pieces), 2 and 3 ranks,
# all_reduce, broadcast and reduce, every size checked; staged_bw plaintext and TLS 16-128 MiB.
# (3) GPU tests, if time is left.
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
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, collective, program and its arguments
  local l=$1 np=$2 c=$3; shift 3
  printf "%-6s np%-2s %-10s " $l $np $c
  timeout 60 mpirun -np $np --bind-to none "$@" -b 512K -e 16M -f 2 -n 50 -w 10 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2 3; do
  line p1m 2 all_reduce $B all_reduce
  line p256k 2 all_reduce $B-p256k all_reduce
  line ompi 2 all_reduce /tmp/ompi_bench -C all_reduce
done 2>&1 | tee $R/np2-pieces.txt
el "remote pieces"
wait
el "builds"
F=$BUILD/f
for np in 2 3; do for t in all_reduce broadcast reduce; do
  timeout 90 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo \
    $F/${t}_perf -b 50000000 -e 100000000 -f 2 -c 1 -n 2 -w 1 > $R/staged-chk-$t-np$np.log 2>&1
  echo "staged-chk-$t-np$np rc=$? $(grep -E 'Out of bounds' $R/staged-chk-$t-np$np.log | awk '{print $(NF-1), $NF}')"
done; done
el "staged correctness"
st() { # label
  local l=$1
  timeout 120 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo ${PSK:+-x FERROCCL_BENCH_PSK=$PSK} $BUILD/staged_bw 16 128 > $R/staged-$l.txt 2>&1
  echo "== staged $l rc=$?"; grep -E "^ +[0-9]+ " $R/staged-$l.txt
}
echo "#      bytes     host     cold    floor   device  r-host  r-cold r-floor     host     cold    floor   device   copies"
PSK=0123456789abcdef0123456789abcdef-round129; before 200 && st tls-new
PSK=; before 230 && st plain-new
el "staged"
if before 250; then timeout 90 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"; grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head; fi
cd $OUT && tar czf r.tgz r && rm -rf r
