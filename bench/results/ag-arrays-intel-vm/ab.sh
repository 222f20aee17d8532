#!/bin/bash
# A/B: 2 ranks, --arrays, default vs staged variants, alternating; ompi as reference
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
coll=$1; lo=$2; hi=$3; reps=${4:-3}; shift 4
M="mpirun -np 2 --bind-to none -x NCCL_SOCKET_IFNAME=lo"
for r in $(seq $reps); do
  for v in "$@"; do
    echo "== rep $r variant $v"
    if [ "$v" = ompi ]; then $M /tmp/ompi_bench -C $coll -b $lo -e $hi -f 2 -n 200 -w 20 --arrays $EXTRA 2>&1 | grep -E "^ +[0-9]" | awk '{print $1, $6}'
    else env $( [ "$v" != default ] && echo "$v") $M /tmp/fb $coll -b $lo -e $hi -f 2 -n 200 -w 20 --arrays $EXTRA 2>&1 | grep -E "^ +[0-9]" | awk '{print $1, $6}'; fi
  done
done
