#!/usr/bin/env bash
# 4 ranks on the 2-core VM (more ranks than cores: the default never relays), all-gathers
# 512 KiB-8 MiB, fresh and reused inputs: the default against the relay wherever nobody
# stages (FERROCCL_NODE_RELAY_MIN=0), and Open MPI. Three alternations. $B: ferroccl-bench.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
line() {
  local l=$1; shift
  printf "%-13s np4 all_gather " $l
  mpirun -np 4 --oversubscribe --bind-to none "$@" -b 512K -e 8M -f 2 -n 20 -w 5 2>&1 | awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $6} /[Ee]rror|failed/{print}'
  echo
}
lscpu | grep "Model name"; date -u
for i in 1 2 3; do for m in fresh reused; do
  f=""; [ $m = fresh ] && f=--fresh-inputs
  line dflt-$m $B all_gather $f
  line relay-$m -x FERROCCL_NODE_RELAY_MIN=0 $B all_gather $f
  line ompi-$m /tmp/ompi_bench -C all_gather $f
done; grep -E "^cpu " /proc/stat; done
