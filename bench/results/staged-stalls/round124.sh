#!/usr/bin/env bash
# Round 124 (device machine, 2026-12-06): the final build of the session (c5f9daf: the staged
# order change plus its review's fixes) on the GPU: GPU tests, nccl-tests smoke, nccl-tests
# through the staged path over sockets (four collectives, 2 and 3 ranks, data checked),
# staged_bw with TLS (results verified by the benchmark), one more plaintext pair against
# 6356605, and the COLL log lines of a staged call (one per call, not two).
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1 &
timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
wait
OUT=$R/nt timeout 170 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests smoke > $R/nccl-tests-smoke.txt 2>&1; el "nccl-tests smoke rc=$?"
sed -n '/==== summary/,$p' $R/nccl-tests-smoke.txt
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
NT=/tmp/nccl-tests-build/ferroccl
for np in 2 3; do for t in all_reduce all_gather reduce_scatter broadcast; do
  timeout 60 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK \
    $NT/${t}_perf -b 8 -e 32M -f 4 -c 1 -n 3 -w 1 > $R/staged-$t-np$np.txt 2>&1
  echo "staged $t np$np rc=$? $(grep -E 'Out of bounds' $R/staged-$t-np$np.txt) $(grep -cE '^ +[0-9]+ ' $R/staged-$t-np$np.txt) sizes"
done; done
el "staged nccl-tests"
NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK \
  -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS $NT/all_reduce_perf -b 4M -e 4M -c 0 -n 4 -w 1 > $R/coll-log.txt 2>&1
echo "COLL plan lines for the 4 MiB all-reduce: $(grep -c 'AllReduce count 1048576' $R/coll-log.txt); staged jobs: $(grep -c 'enqueue began' $R/coll-log.txt)"
FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round124 timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK -x FERROCCL_BENCH_PSK $BUILD/staged_bw 1 8 > $R/tls.txt 2>&1
el "tls rc=$?"; grep -E "^ +[0-9]+ " $R/tls.txt
for b in prev new; do
  pfx=$PWD/.dev/prefix; [ $b = prev ] && pfx=$PWD/.dev/prefix-prev
  timeout 90 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$pfx/lib $SOCK $BUILD/staged_bw 1 16 > $R/ab-$b.txt 2>&1
  el "ab $b rc=$?"; grep -E "^ +[0-9]+ " $R/ab-$b.txt
done
cd $OUT && tar czf r.tgz r && rm -rf r
