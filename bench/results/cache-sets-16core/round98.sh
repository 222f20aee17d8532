#!/usr/bin/env bash
# Round 98 (device machine, 2026-12-06), build a4e0afc (start_fold, 64 KiB oversubscribed broadcast
# threshold, 128 tiny slots per rank). Carry .dev. (Rounds 96 and 97, never run for want of a
# machine, had the same steps on older builds.)
#  1. Every GPU test, then gpu_processes_abort_device_send 20 times (its race fixed in c044bdc:
#     rank 1 aborts only after rank 0 has looked at its stream). nccl-tests built meanwhile.
#  2. nccl-tests all_reduce_perf -np 2 -G 5 -c 1 (graph capture), #wrong must be 0.
#  3. Open MPI against ferroccl at NPS ranks (default "8 2") with the harness that warms both alike
#     (05e08d2), until LIMIT s (540).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; mkdir -p $BUILD
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; } > $R/host.txt
( make -C $SRC -j4 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$R/nccl-tests-build.txt 2>&1; echo "nccl-tests build rc=$?" ) &
timeout 200 env FERROCCL_TIMEOUT=30 .dev/it cuda --test-threads 1 > $R/gpu-tests.txt 2>&1; echo "gpu tests rc=$?"
grep -E "test result|panicked|FAILED" $R/gpu-tests.txt | head -10; el "gpu tests"
fails=0
for i in $(seq 20); do
  timeout 60 .dev/it --exact cuda::gpu_processes_abort_device_send --test-threads 1 > $R/abort-$i.txt 2>&1 || { fails=$((fails+1)); echo "abort run $i failed"; }
done
echo "abort_device_send: $fails of 20 failed"; el "abort loop"
wait
LD_LIBRARY_PATH=$PFX/lib timeout 120 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH $BUILD/f/all_reduce_perf -b 8 -e 64M -f 8 -G 5 -c 1 > $R/nccl-tests-G5.txt 2>&1
echo "nccl-tests -G 5 rc=$? $(grep -E 'wrong|Avg bus' $R/nccl-tests-G5.txt | tr '\n' ' ')"; el "nccl-tests"
# 4. The staged path emulated on the CPU (no GPU): run_progressive with a thread landing the
#    input pieces at GBPS and one copying released output pieces back, against the host call, 2
#    rank threads over sockets (examples/staged_emul.rs; GBPS=0: no copies).
[ -x .dev/exp/staged_emul ] && for g in 25 0; do PIECE=262144 GBPS=$g NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1 timeout 60 .dev/exp/staged_emul 10 > $R/emul-$g.txt 2>&1; echo "emul GBPS=$g rc=$?"; cat $R/emul-$g.txt; done; el "emul"
B=$PWD/.dev/bin/ferroccl-bench
# 5. 16-rank reduce-scatter 32-512 KiB (128 KiB was 0.94x Open MPI in round 95): slots (default
#    up to 128 KiB) against kernel copies from 128 KiB (FERROCCL_NODE_STAGE_MAX=65536), and Open
#    MPI, 3 alternating launches, malloc'd buffers, 200 calls per size.
MR="mpirun -np 16 --bind-to none -x NCCL_SOCKET_IFNAME=lo"
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c 2>/dev/null
for i in 1 2 3; do
  $MR $B reduce_scatter -b 32K -e 512K -f 2 -n 200 -w 20 2>&1 | grep -E "^ +[0-9]+ " | awk -v i=$i '{printf "slots%s %s %s | ", i, $1, $6} END {print ""}'
  $MR -x FERROCCL_NODE_STAGE_MAX=65536 $B reduce_scatter -b 32K -e 512K -f 2 -n 200 -w 20 2>&1 | grep -E "^ +[0-9]+ " | awk -v i=$i '{printf "kcopy%s %s %s | ", i, $1, $6} END {print ""}'
  $MR /tmp/ompi_bench -C reduce_scatter -b 32K -e 512K -f 2 -n 200 -w 20 2>&1 | grep -E "^ +[0-9]+ " | awk -v i=$i '{printf "ompi%s %s %s | ", i, $1, $6} END {print ""}'
done 2>&1 | tee $R/rs16.txt; el "rs16"
# 6. 8-rank all-gather 256 KiB-32 MiB: slots (today's rule, FERROCCL_NODE_STAGE_MAX=1T) against
#    kernel copies (0), 5 alternating launches (round 93: kernel copies faster at 512 KiB-2 MiB
#    in 3 of 3, mixed above; round 92: 2 MiB 0.78x Open MPI through slots).
M8="mpirun -np 8 --bind-to none -x NCCL_SOCKET_IFNAME=lo"
for i in 1 2 3 4 5; do
  for st in 1T 0; do
    $M8 -x FERROCCL_NODE_STAGE_MAX=$st $B all_gather -b 256K -e 32M -f 4 -n 20 -w 5 2>&1 | grep -E "^ +[0-9]+ " | awk -v t=$st$i '{printf "stage%s %s %s | ", t, $1, $6} END {print ""}'
  done
done 2>&1 | tee $R/ag8.txt; el "ag8"
for NP in ${NPS:-8 2}; do
  left=$(( ${LIMIT:-540} - ($(date +%s) - T0) )); [ $left -lt 90 ] && break
  TMPDIR=$R/tmp timeout $left bench/compare_ompi.sh -np $NP --sizes 8:128M --factor 4 --repeat 2 --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 120 --out $R/np$NP > $R/np$NP.txt 2>&1; echo "compare np$NP rc=$?"
  grep -A16 "^## Targets" $R/np$NP.md; el "compare np$NP"
done
cd $OUT && tar czf r.tgz r && rm -rf r
