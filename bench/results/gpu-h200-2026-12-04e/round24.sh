#!/usr/bin/env bash
# local_order: rank threads sharing the GPU with 1 and 2 hardware queues (stopped every time
# before), then the whole cuda:: suite three times with the default 8.
set -u
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LD_LIBRARY_PATH=$PWD/.dev/prefix/lib
for c in 1 2; do
  ( CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 120 .dev/it cuda:: --test-threads 1 > $R/conn$c.txt 2>&1; echo "connections=$c cuda:: rc=$?"; grep -E "test result|FAILED|panicked at" $R/conn$c.txt | head -5 )
done
for i in 1 2 3; do
  ( timeout 120 .dev/it cuda:: --test-threads 1 > $R/it-$i.txt 2>&1; echo "default cuda:: run $i rc=$?"; grep -E "test result|FAILED|panicked at" $R/it-$i.txt | head -5 )
done
el "it"
cd $OUT && tar czf r.tgz r && rm -rf r
