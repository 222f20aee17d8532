#!/usr/bin/env bash
# Round 99 (device machine, 2026-12-06), build fe01a24 (all-gathers at 3-8 ranks by kernel copies
# above 64 KiB; the abort test's marker file named by a hash). Carry .dev.
#  1. gpu_processes_abort_device_send 8 times (round 98: failed every run on its marker file's name).
#  2. The staged path emulated (2 rank threads, GBPS 25 and 0), `landed` now timed without the check.
#  3. Open MPI against ferroccl at 8 ranks, all four collectives, one sweep each, until LIMIT s.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; } > $R/host.txt
fails=0
for i in $(seq ${ABORT_RUNS:-8}); do
  timeout 60 .dev/it --exact cuda::gpu_processes_abort_device_send --test-threads 1 --nocapture > $R/abort-$i.txt 2>&1 || { fails=$((fails+1)); echo "abort run $i failed"; grep -m3 "panicked\|marker" $R/abort-$i.txt; }
done
echo "abort_device_send: $fails of ${ABORT_RUNS:-8} failed"; el "abort loop"
for g in 25 0; do PIECE=262144 GBPS=$g NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1 timeout 60 .dev/exp/staged_emul 10 > $R/emul-$g.txt 2>&1; echo "emul GBPS=$g rc=$?"; cat $R/emul-$g.txt; done; el "emul"
B=$PWD/.dev/bin/ferroccl-bench
left=$(( ${LIMIT:-300} - ($(date +%s) - T0) ))
[ $left -gt 60 ] && TMPDIR=$R/tmp timeout $left bench/compare_ompi.sh -np 8 --sizes 8:128M --factor 4 --repeat 1 --no-build --keep-logs --ferroccl-bench $B --timeout 120 --out $R/np8 > $R/np8.txt 2>&1; echo "compare np8 rc=$?"
grep -A8 "^## Targets" $R/np8.md; el "compare np8"
rm -rf $R/tmp $R/np8-logs
