#!/usr/bin/env bash
# Round 101 (device machine, 2026-12-06): why the 2-rank broadcast of 32-128 MiB (malloc'd
# buffers) is 0.86-0.89x Open MPI on the 16-core host (round 100) but 1.25x on the 2-core VM.
# Same build as round 100 (.dev, 002de16). Per launch, 2 ranks, broadcast 8-128 MiB, us out
# of place: ferroccl by kernel copies (default), the same without huge pages
# (FERROCCL_HUGE_PAGES=0), through the node area's slots (FERROCCL_NODE_STAGE_MAX=256M), and
# Open MPI's MPI_Bcast; three alternations. Also the host's transparent huge page settings and
# how much of the ranks' memory was on huge pages.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u;
  for f in enabled defrag khugepaged/defrag; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done;
  lscpu | grep -i cache; } > $R/host.txt 2>&1
cat $R/host.txt
mpicc -O2 -o /tmp/ompi_bench_r101 bench/ompi_bench.c || exit 1
B=$PWD/.dev/bin/ferroccl-bench
run() {  # label, then mpirun arguments
  local l=$1; shift
  printf "%-8s " $l
  timeout 120 mpirun -np 2 --bind-to none "$@" -b 8M -e 128M -f 4 -n 10 -w 3 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for i in 1 2 3; do
  run default $B broadcast
  run hp0 -x FERROCCL_HUGE_PAGES=0 $B broadcast
  run slots -x FERROCCL_NODE_STAGE_MAX=256M $B broadcast
  run ompi /tmp/ompi_bench_r101 -C broadcast
done 2>&1 | tee $R/bcast2.txt
el "alternations"
# Huge pages under the ranks while they run (the default), sampled mid-run.
( mpirun -np 2 --bind-to none $B broadcast -b 32M -e 32M -n 3000 -w 3 > $R/hp-run.txt 2>&1 & )
sleep 3; for p in $(pgrep -f "ferroccl-bench broadcast -b 32M"); do echo "pid $p: $(grep -E 'AnonHugePages' /proc/$p/smaps_rollup)"; done | tee $R/hp.txt
wait; sleep 8; el done
