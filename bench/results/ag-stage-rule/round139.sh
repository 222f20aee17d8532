#!/usr/bin/env bash
# Round 139 (device machine, 16-core host; 2026-12-07). Parts C, B, A in that order (device time
# ran low: B first), each stopped by a clock guard.
# A. The all-gather questions prepared for round 138, which never ran: malloc'd all-gathers relayed
#    from 512 KiB (r512) or 1 MiB (r1m) against the default's slots there; the relay at 3 ranks.
# B. Issue 15, malloc'd all-reduce and reduce-scatter at 8 and 16 ranks where peers read inputs
#    by kernel copies (all-reduce above 128 KiB, reduce-scatter above 512 KiB): every reducer
#    read the inputs in rank order, so all ranks queued on rank 0's process first (each
#    process_vm_readv takes the owner's memory-map lock). The candidate (.dev/bin/
#    ferroccl-bench-gather, built from branch gather-candidate) reads them into scratch
#    starting with rank me + 1, then folds in rank order (same bits). dflt (main) vs gath vs
#    ncclMemAlloc vs Open MPI, fresh and reused inputs, alternated.
# C. The candidate's node unit tests on 16 cores (they gather at any core count; there the rank
#    threads run side by side).
# Not run on 2026-12-07 (no device machine started all session). To run it: check out branch
# gather-candidate, `cargo build --release -p ferroccl-bench`, copy the binary (stripped) to
# .dev/bin/ferroccl-bench-gather and `cargo test --release --features openssl3,mpi,ib --no-run`'s
# lib test binary to .dev/unit-gather; back on main, build .dev/bin/ferroccl-bench and write
# .dev/build.commit; carry [".dev/bin", ".dev/unit-gather", ".dev/build.commit"] (the whole
# tree with .dev passes the 64 MiB cap).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
B=$PWD/.dev/bin/ferroccl-bench G=$PWD/.dev/bin/ferroccl-bench-gather
line() {  # label, np, coll, sizes, program and its arguments
  local l=$1 np=$2 c=$3 sz=$4; shift 4
  printf "%-14s np%-2s %s " $l $np $c
  timeout 40 mpirun -np $np --bind-to none "$@" $sz -f 2 -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed|panick/{print}'
  echo
}
el "C: unit tests"
timeout 60 .dev/unit-gather coll::node 2>&1 | tail -4 | tee $R/unit.txt
el "B: all-reduce, reduce-scatter"
for i in 1 2; do for np in 8 16; do for c in all_reduce reduce_scatter; do for m in fresh reused; do
  before 250 || break 4
  f=""; [ $m = fresh ] && f=--fresh-inputs
  sz="-b 128K -e 2M"; [ $c = reduce_scatter ] && sz="-b 512K -e 4M"
  line dflt-$m $np $c "$sz" $B $c $f
  line gath-$m $np $c "$sz" $G $c $f
  line nccl-$m $np $c "$sz" $B $c --alloc nccl $f
  line ompi-$m $np $c "$sz" /tmp/ompi_bench -C $c $f
done; done; done; done 2>&1 | tee $R/ar.txt
el "A: all-gather"
AG="-b 128K -e 4M"
R512="-x FERROCCL_NODE_STAGE_MAX=256K -x FERROCCL_NODE_RELAY_MIN=512K"
R1M="-x FERROCCL_NODE_STAGE_MAX=512K -x FERROCCL_NODE_RELAY_MIN=1M"
ALL="-x FERROCCL_NODE_RELAY_MIN=0"
for i in 1 2; do for np in 4 8 16 3; do for m in fresh reused; do
  before 380 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $np all_gather "$AG" $B all_gather $f
  if [ $np = 3 ]; then
    line relay-$m $np all_gather "$AG" $ALL $B all_gather $f
    line nccl-$m $np all_gather "$AG" $B all_gather --alloc nccl $f
    line ncrelay-$m $np all_gather "$AG" $ALL $B all_gather --alloc nccl $f
  else
    line r512-$m $np all_gather "$AG" $R512 $B all_gather $f
    line r1m-$m $np all_gather "$AG" $R1M $B all_gather $f
    line nccl-$m $np all_gather "$AG" $B all_gather --alloc nccl $f
  fi
  line ompi-$m $np all_gather "$AG" /tmp/ompi_bench -C all_gather $f
done; done; done 2>&1 | tee $R/ag.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
