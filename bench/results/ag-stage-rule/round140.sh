#!/usr/bin/env bash
# Round 140 (device machine, 16-core host; 2026-12-07). Round 139 (r139/) left three questions
# open with two alternations and launch-to-launch spreads up to 1.4x; this round repeats just
# those cells, up to four alternations each, parts A, A2 then B (device time ran low), each
# stopped by a clock guard.
# B. The gather candidate (.dev/bin/ferroccl-bench-gather, branch gather-candidate 0f6c08a:
#    kernel-copy inputs read from rank me + 1 on into scratch, then folded in rank order) won
#    10-27% with fresh inputs at 8 ranks 128 KiB-1 MiB all-reduce and 16 ranks 256-512 KiB
#    all-reduce and reduce-scatter, and lost 13-117% with reused inputs and at 16 ranks 1 MiB
#    all-reduce. dflt (main) vs gath vs Open MPI, fresh and reused.
# A. Malloc'd all-gathers by relay at 3 ranks (FERROCCL_NODE_RELAY_MIN=0, i.e. every size; 3
#    ranks never relay by default): 0.73-0.9x the default's time at 255 KiB-3 MiB in r139.
#    Sizes to 8 MiB here (whole output), and ncclMemAlloc buffers both ways. Up to 1 MiB the
#    default stages 3-rank all-gathers through slots, and a staged input never relays, so
#    `relay` differs from `dflt` only above 1 MiB (yet ran faster at 255 KiB-1 MiB in r139);
#    `srelay` also stages only up to 128 KiB, so it relays from 256 KiB.
# A2. Relaying malloc'd all-gathers from 1 MiB at 4, 8 and 16 ranks (default: slots up to
#    1 MiB, relay from 2 MiB): r139 said yes at 4-8 ranks 1 MiB, but the same setting differed
#    by 1.4x between its two launches.
# Build: as round139.sh (.dev/bin/ferroccl-bench from main, -gather from the branch); carry
# [".dev/bin", ".dev/build.commit"].
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
el "A: all-gather at 3 ranks"
ALL="-x FERROCCL_NODE_RELAY_MIN=0" SREL="-x FERROCCL_NODE_STAGE_MAX=128K -x FERROCCL_NODE_RELAY_MIN=256K"
for i in 1 2 3 4; do for m in fresh reused; do
  before 110 || break 2
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m 3 all_gather "-b 128K -e 8M" $B all_gather $f
  line relay-$m 3 all_gather "-b 128K -e 8M" $ALL $B all_gather $f
  line srelay-$m 3 all_gather "-b 128K -e 8M" $SREL $B all_gather $f
  line nccl-$m 3 all_gather "-b 128K -e 8M" $B all_gather --alloc nccl $f
  line ncrelay-$m 3 all_gather "-b 128K -e 8M" $ALL $B all_gather --alloc nccl $f
  [ $i -le 2 ] && line ompi-$m 3 all_gather "-b 128K -e 8M" /tmp/ompi_bench -C all_gather $f
done; done 2>&1 | tee $R/ag3.txt
el "A2: all-gather relayed from 1 MiB"
R1M="-x FERROCCL_NODE_STAGE_MAX=512K -x FERROCCL_NODE_RELAY_MIN=1M"
for i in 1 2 3 4; do for np in 4 8 16; do for m in fresh reused; do
  before 230 || break 3
  f=""; [ $m = fresh ] && f=--fresh-inputs
  if [ $((i % 2)) = 1 ]; then line dflt-$m $np all_gather "-b 512K -e 2M" $B all_gather $f; line r1m-$m $np all_gather "-b 512K -e 2M" $R1M $B all_gather $f
  else line r1m-$m $np all_gather "-b 512K -e 2M" $R1M $B all_gather $f; line dflt-$m $np all_gather "-b 512K -e 2M" $B all_gather $f; fi
  [ $i -le 2 ] && line ompi-$m $np all_gather "-b 512K -e 2M" /tmp/ompi_bench -C all_gather $f
done; done; done 2>&1 | tee $R/ag.txt
el "B: all-reduce, reduce-scatter"
for i in 1 2 3 4; do for np in 8 16; do for c in all_reduce reduce_scatter; do for m in fresh reused; do
  before 330 || break 4
  f=""; [ $m = fresh ] && f=--fresh-inputs
  sz="-b 128K -e 1M"; [ $c = reduce_scatter ] && sz="-b 512K -e 4M"
  if [ $((i % 2)) = 1 ]; then line dflt-$m $np $c "$sz" $B $c $f; line gath-$m $np $c "$sz" $G $c $f
  else line gath-$m $np $c "$sz" $G $c $f; line dflt-$m $np $c "$sz" $B $c $f; fi
  [ $i -le 2 ] && line ompi-$m $np $c "$sz" /tmp/ompi_bench -C $c $f
done; done; done; done 2>&1 | tee $R/ar.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
