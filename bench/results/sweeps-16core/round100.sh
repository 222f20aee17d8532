#!/usr/bin/env bash
# Round 100 (device machine, 2026-12-06): ferroccl against Open MPI on the 16-core host, malloc'd
# and ncclMemAlloc buffers, REPEAT alternating repeats per rank count (issue 15's proof: three
# repeats at 2, 8 and 16 ranks). Carry .dev (built at the commit in .dev/build.commit).
# AB=1 first times .dev/bin/ferroccl-bench-old (the build before staged all-gathers and
# reduce-scatters returned early) against .dev/bin/ferroccl-bench, alternating, 3 launches each.
#   AB=1 NPS="16 8" REPEAT=3 LIMIT=570 bash bench/results/sweeps-16core/round100.sh
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R/tmp
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uptime; date -u; } > $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
ab() {  # ranks collective min max: one line per launch, "size us" pairs (out of place)
  for i in 1 2 3; do for v in old new; do
    b=$B; [ $v = old ] && b=$B-old
    printf "%s np%s %s %s: " $v $1 $2 $i
    timeout 60 mpirun -np $1 --bind-to none $b $2 -b $3 -e $4 -f 4 -n 300 -w 30 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'; echo
  done; done
}
if [ "${AB:-0}" = 1 ]; then
  { ab 16 reduce_scatter 32K 512K; ab 16 all_gather 32K 512K; ab 8 all_gather 16K 64K; ab 8 reduce_scatter 32K 512K; } > $R/ab.txt 2>&1
  cat $R/ab.txt; el "A/B"
fi
for np in ${NPS:-16 8}; do
  left=$(( ${LIMIT:-570} - ($(date +%s) - T0) ))
  [ $left -lt 90 ] && { el "skip np$np: $left s left"; continue; }
  TMPDIR=$R/tmp timeout $left bench/compare_ompi.sh -np $np --sizes 8:128M --factor 4 --repeat ${REPEAT:-3} --both-allocs --no-build --keep-logs --ferroccl-bench $B --timeout 300 --out $R/np$np > $R/np$np.txt 2>&1
  rc=$?; el "compare np$np rc=$rc"
  if [ ! -f $R/np$np.md ] && [ -d $R/np$np-logs ]; then   # cut short: report what finished
    bench/compare_ompi.sh -np $np --both-allocs --report-from $R/np$np-logs --out $R/np$np > /dev/null 2>&1; el "np$np reported from logs"
  fi
  grep -A14 "^## Targets" $R/np$np.md 2>/dev/null | grep -E "MISS|PASS"
  rm -rf $R/np$np-logs
done
rm -rf $R/tmp
