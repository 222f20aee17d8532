#!/usr/bin/env bash
# Round 107 (device machine, 2026-12-06): broadcast receivers' kernel copies of the root's
# malloc'd buffer, each receiver starting at its own share of the message and wrapping around
# (pieces of EXP_KGRAIN bytes, one process_vm_readv each: round107-exp.patch, EXP_BCAST=4)
# against one call for the whole message (EXP_BCAST=0, the library's way) and the slots.
# 16 ranks 8 MiB and 8 ranks 2 MiB, in a buffer of the message's size and in a 32 MiB one.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
X=$PWD/.dev/exp/ferroccl-bench-exp
line() {  # label np size max then mpirun args
  local l=$1 np=$2 s=$3 e=$4; shift 4
  printf "%-12s np%-2s buf %-4s " $l $np $e
  timeout 60 mpirun -np $np --bind-to none "$@" $X broadcast -b $s -e $e -f 4 -n 20 -w 5 -c 1 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s/%s  ", $1, $6, $9} /[Ee]rror|failed|panick/{print}'
  echo
}
for i in 1 2 3; do
  for cfg in "16 8M" "8 2M"; do set -- $cfg; np=$1; s=$2
    for e in $s 32M; do
      line whole $np $s $e -x EXP_BCAST=0
      line stag256K $np $s $e -x EXP_BCAST=4
      line stag1M $np $s $e -x EXP_BCAST=4 -x EXP_KGRAIN=1048576
      line slots $np $s $e -x FERROCCL_NODE_STAGE_MAX=16M
    done
  done
done
