#!/usr/bin/env bash
# Round 146 (device machine, 16-core host; 2026-12-07): what a kernel copy of 4 KiB pages costs
# against memcpy on this host, for comparison with the AMD 2-core VM
# (ag-stage-rule/vm/kernel_copy_cost.txt: 1 MiB 126 against 33 us on 4 KiB pages), three runs.
set -u
R=$OUT/r; mkdir -p $R
{ nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; } > $R/host.txt 2>&1
gcc -O2 -o /tmp/kcc bench/results/ag-stage-rule/vm/kernel_copy_cost.c
for i in 1 2 3; do /tmp/kcc; /tmp/kcc huge; done 2>&1 | tee $R/kernel_copy_cost.txt
cd $OUT && tar czf r.tgz r && rm -rf r
