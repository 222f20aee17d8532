#!/usr/bin/env bash
# Round 120 (device machine, 2026-12-06): the staged path with pieces in the plan's order and
# the job handed over before the copies (5d16201, .dev/prefix) against the build before it
# (6356605, .dev/prefix-prev), alternating: staged_bw 1 16, three pairs; one TRACE run of the
# new build at 2-4 MiB for the timeline (timeline.py). Then correctness: GPU tests, nccl-tests
# smoke, and nccl-tests through the staged path over sockets (NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1) for all_reduce, all_gather, reduce_scatter, broadcast at 2 and 3 ranks.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
# staged_bw links libnccl by name: one binary, the library chosen by LD_LIBRARY_PATH.
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1
el "staged_bw build rc=$?"; head -5 $R/staged_build.txt
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
for i in 1 2 3; do for b in prev new; do
  pfx=$PWD/.dev/prefix; [ $b = prev ] && pfx=$PWD/.dev/prefix-prev
  timeout 90 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$pfx/lib $SOCK $BUILD/staged_bw 1 16 > $R/ab-$b-$i.txt 2>&1
  el "ab $b $i rc=$?"; grep -E "^ +[0-9]+ " $R/ab-$b-$i.txt
done; done
NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=$R/trace.%h.%p \
  timeout 60 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK -x STAGED_BW_DETAIL=1 \
  -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_DEBUG_FILE $BUILD/staged_bw 2 4 > $R/staged-trace.txt 2>&1
el "trace rc=$?"; grep -E "^ +[0-9]+ " $R/staged-trace.txt
timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
OUT=$R/nt timeout 170 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests smoke > $R/nccl-tests-smoke.txt 2>&1; el "nccl-tests smoke rc=$?"
sed -n '/==== summary/,$p' $R/nccl-tests-smoke.txt
NT=/tmp/nccl-tests-build/ferroccl
for np in 2 3; do for t in all_reduce all_gather reduce_scatter broadcast; do
  timeout 60 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK \
    $NT/${t}_perf -b 8 -e 32M -f 4 -c 1 -n 3 -w 1 > $R/staged-$t-np$np.txt 2>&1
  echo "staged $t np$np rc=$? $(grep -E 'Out of bounds' $R/staged-$t-np$np.txt) $(grep -cE '^ +[0-9]+ ' $R/staged-$t-np$np.txt) sizes"
done; done
el done
cd $OUT && tar czf r.tgz r && rm -rf r
