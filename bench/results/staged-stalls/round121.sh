#!/usr/bin/env bash
# Round 121 (device machine, 2026-12-06): the staged-order change (5d16201, .dev/prefix)
# against 6356605 (.dev/prefix-prev) where round 120 did not look: with TLS (staged_bw 1 16,
# FERROCCL_BENCH_PSK, two alternating pairs), and all-gather and reduce-scatter through the
# staged path over sockets (nccl-tests built once against ferroccl, the library chosen by
# LD_LIBRARY_PATH; 2 ranks sharing the GPU, 1-64 MiB, two alternating pairs, data checked).
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; uptime; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
nvcc -O2 $GEN -I.dev/prefix/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L.dev/prefix/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1 &
OUT=$R/nt timeout 200 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests build-only > $R/nccl-tests-build.txt 2>&1
wait; el "builds"; tail -3 $R/nccl-tests-build.txt
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
export FERROCCL_BENCH_PSK=0123456789abcdef0123456789abcdef-round121
for i in 1 2; do for b in prev new; do
  pfx=$PWD/.dev/prefix; [ $b = prev ] && pfx=$PWD/.dev/prefix-prev
  timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$pfx/lib $SOCK -x FERROCCL_BENCH_PSK $BUILD/staged_bw 1 16 > $R/tls-$b-$i.txt 2>&1
  el "tls $b $i rc=$?"; grep -E "^ +[0-9]+ " $R/tls-$b-$i.txt
done; done
unset FERROCCL_BENCH_PSK
NT=/tmp/nccl-tests-build/ferroccl
for i in 1 2; do for t in all_gather reduce_scatter; do for b in prev new; do
  pfx=$PWD/.dev/prefix; [ $b = prev ] && pfx=$PWD/.dev/prefix-prev
  timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$pfx/lib $SOCK \
    $NT/${t}_perf -b 1M -e 64M -f 2 -c 1 -n 10 -w 3 > $R/nt-$t-$b-$i.txt 2>&1
  printf "%-15s %-4s %s rc=%s %s | " $t $b $i $? "$(grep -E 'Out of bounds' $R/nt-$t-$b-$i.txt | awk '{print $NF, $(NF-1)}')"
  grep -E "^ +[0-9]+ " $R/nt-$t-$b-$i.txt | awk '{printf "%s:%s ", $1, $6}'; echo
done; done; done
el done
cd $OUT && tar czf r.tgz r && rm -rf r
