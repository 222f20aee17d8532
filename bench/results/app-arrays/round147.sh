#!/usr/bin/env bash
# Round 147 (device machine, 16-core host; 2026-12-07): what the library's own measurement of
# kernel copies on 4 KiB pages (peer_mem::small_page_kernel_copies_slow, logged at INFO) finds
# on this host when both ranks of a 2-rank job take it at once, eight launches; and the 2-rank
# all-reduce of 1 and 2 MiB arrays with that build against the base.
# Build: .dev/bin/fb-cand2 (the probe, ratio bound 3.0), .dev/bin/fb-base (4b84124).
set -u
R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
for i in 1 2 3 4 5 6 7 8; do
  mpirun -np 2 --bind-to none -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=ALL .dev/bin/fb-cand2 all_reduce -b 1M -e 1M -n 40 -w 5 2>&1 | grep -E "kernel copy of|^ +1048576" | sed 's/^.*SHM: //'
done 2>&1 | tee $R/probe.txt
for i in 1 2 3; do for s in 1M 2M; do for b in base cand2; do
  echo -n "$b $s "; mpirun -np 2 --bind-to none .dev/bin/fb-$b all_reduce -b $s -e $s -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s %s", $6, $10}'; echo
done; done; done 2>&1 | tee $R/ar2.txt
cd $OUT && tar czf r.tgz r && rm -rf r
