#!/usr/bin/env bash
# Round 115 (device machine, 2026-12-06): round 114 showed the 2-rank all-reduce taking 2.1-2.4x
# longer per byte from 16 MiB on the 16-core host (4 MiB 0.60-0.65 ms, 16 MiB 5.0-5.7 ms), where
# outputs start to be written with streaming stores (STREAM_MIN, 16 MiB, through scratch). Carry
# .dev: ferroccl-bench = 8ebbb18, ferroccl-bench-nostream = the same with STREAM_MIN = usize::MAX
# (round115-exp.patch). All-reduce 4-64 MiB, malloc'd buffers, default / nostream / Open MPI,
# alternating twice, at 2, 8 and 16 ranks.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; } 2>&1 | tee $R/host.txt
B=$PWD/.dev/bin/ferroccl-bench
mpicc -O2 -o /tmp/ompi_bench_r115 bench/ompi_bench.c || exit 1
line() {  # label, np, then the program and its arguments: "size us" pairs
  local l=$1 np=$2; shift 2
  printf "%-8s np%-2s " $l $np
  timeout 120 mpirun -np $np --bind-to none "$@" -b 4M -e 64M -f 2 -n 10 -w 3 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
for np in 2 8 16; do for i in 1 2; do
  line default $np $B all_reduce
  line nostream $np $B-nostream all_reduce
  line ompi $np /tmp/ompi_bench_r115 -C all_reduce
done; done 2>&1 | tee $R/stream.txt
el done
