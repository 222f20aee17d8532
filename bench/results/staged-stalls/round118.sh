#!/usr/bin/env bash
# Round 118 (device machine, 2026-12-06): what happens during a stalled staged call (issue 14).
# staged_bw with STAGED_BW_DETAIL=1 prints every device call with the host's TCP loss-recovery
# counters and each rank's run-queue wait (schedstat) during it: is a stall a retransmission,
# or a thread that was runnable and not run? Three runs with the socket helper threads (the
# default on 16 cores), one with the executor driving the sockets itself
# (NCCL_SOCKET_NTHREADS=0). Then issue 15's open streaming point: malloc'd all-reduce at 4 and 6
# ranks, 8-32 MiB, HEAD (streaming stores from 16 MiB above 2 ranks) against
# .dev/bin/ferroccl-bench-exp (from 32 MiB up to 7 ranks), alternating three times. Then the GPU
# tests and nccl-tests smoke at this build (HEAD).
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
PFX=$PWD/.dev/prefix; MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; uptime; date -u;
  for k in kernel.sched_min_granularity_ns kernel.sched_base_slice_ns net.ipv4.tcp_recovery net.ipv4.tcp_early_retrans net.ipv4.tcp_reordering net.ipv4.tcp_rmem net.ipv4.tcp_wmem; do sysctl $k 2>/dev/null; done
  cat /sys/kernel/debug/sched/base_slice_ns 2>/dev/null | sed 's/^/base_slice_ns /'; } > $R/host.txt 2>&1
cat $R/host.txt
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1
el "staged_bw build rc=$?"; head -5 $R/staged_build.txt
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
run() {  # label, then extra mpirun arguments
  local l=$1; shift
  timeout 60 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK -x STAGED_BW_DETAIL=1 "$@" $BUILD/staged_bw 1 8 > $R/staged-$l.txt 2>&1
  el "staged $l rc=$?"
  grep -v "^  detail" $R/staged-$l.txt | grep -v "^\[" | tail -6
  # calls over twice their size's median, with what happened during them
  python3 - $R/staged-$l.txt <<'PY'
import sys, collections
calls = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[:1] == ["detail"]:
        calls[f[1]].append((float(f[3]), line.rstrip()))
for mib, c in calls.items():
    med = sorted(t for t, _ in c)[len(c) // 2]
    slow = [l for t, l in c if t > 2 * med]
    print(f"  {mib} MiB: median {med:.0f} us, {len(slow)} of {len(c)} calls over twice it")
    for l in slow[:6]:
        print("   ", l)
PY
}
run threads-1
run threads-2
run inline -x NCCL_SOCKET_NTHREADS=0
run threads-3
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, then the program and its arguments: "size us" pairs
  local l=$1 np=$2; shift 2
  printf "%-5s np%-2s " $l $np
  timeout 60 mpirun -np $np --bind-to none "$@" -b 8M -e 32M -f 2 -n 20 -w 3 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for np in 4 6; do for i in 1 2 3; do
  line head $np $B all_reduce
  line exp $np $B-exp all_reduce
done; done 2>&1 | tee $R/stream-rule.txt
el "stream rule"
timeout 150 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head
timeout 170 bash bench/gpu/nccl_tests.sh .dev/prefix .dev/nccl-tests smoke > $R/nccl-tests-smoke.txt 2>&1; el "nccl-tests smoke rc=$?"
sed -n '/==== summary/,$p' $R/nccl-tests-smoke.txt
