#!/usr/bin/env bash
# Round 141 (device machine, 16-core host; 2026-12-07): the build as committed (6a3f828: the
# direct all-reduce gathers its kernel-copy inputs; 3-rank all-gathers relay), two
# alternations, each part stopped by a clock guard.
# C. The node unit tests on 16 cores (.dev/unit, the lib test binary).
# B. Malloc'd all-reduce at 8 and 16 ranks, 128 KiB-1 MiB, fresh and reused: the default
#    against ncclMemAlloc and Open MPI (the fold-order figures are rounds 139-140's).
# A. 3-rank all-gathers, 1-8 MiB: the default against FERROCCL_NODE_RELAY_MIN=1T (never
#    relays: the rule before), malloc'd and ncclMemAlloc, and Open MPI.
# Build: `cargo build --release -p ferroccl-bench` (stripped) to .dev/bin/, the lib test binary
# of `cargo test --release --features openssl3,mpi,ib --no-run` to .dev/unit; carry
# [".dev/bin", ".dev/unit", ".dev/build.commit"].
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/ferroccl-bench
line() {  # label, np, coll, sizes, program and its arguments
  local l=$1 np=$2 c=$3 sz=$4; shift 4
  printf "%-14s np%-2s %s " $l $np $c
  timeout 40 mpirun -np $np --bind-to none "$@" $sz -f 2 -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed|panick/{print}'
  echo
}
el "C: unit tests"
timeout 60 .dev/unit coll::node 2>&1 | tail -3 | tee $R/unit.txt
el "B: all-reduce"
for i in 1 2; do for np in 8 16; do for m in fresh reused; do
  before 100 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $np all_reduce "-b 128K -e 1M" $B all_reduce $f
  line nccl-$m $np all_reduce "-b 128K -e 1M" $B all_reduce --alloc nccl $f
  line ompi-$m $np all_reduce "-b 128K -e 1M" /tmp/ompi_bench -C all_reduce $f
done; done; done 2>&1 | tee $R/ar.txt
el "A: 3-rank all-gather"
NEVER="-x FERROCCL_NODE_RELAY_MIN=1T"
for i in 1 2; do for m in fresh reused; do
  before 170 || break 2
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m 3 all_gather "-b 1M -e 8M" $B all_gather $f
  line never-$m 3 all_gather "-b 1M -e 8M" $NEVER $B all_gather $f
  line nccl-$m 3 all_gather "-b 128K -e 8M" $B all_gather --alloc nccl $f
  line ncnever-$m 3 all_gather "-b 128K -e 8M" $NEVER $B all_gather --alloc nccl $f
  line ompi-$m 3 all_gather "-b 128K -e 8M" /tmp/ompi_bench -C all_gather $f
done; done 2>&1 | tee $R/ag3.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
