#!/usr/bin/env bash
# Application-sized arrays: each size timed in its own malloc'd buffer of exactly that size
# (-b S -e S), as a simulation code passes its arrays, so buffers from 128 KiB to a few MiB
# are glibc mmapped chunks on 4 KiB pages (nothing gives them huge pages). Per size and rank
# count: ferroccl's default, the same with every buffer through the slots
# (FERROCCL_NODE_STAGE_MAX=1G), ncclMemAlloc buffers, and Open MPI (ompi_bench, malloc'd).
#
#   survey.sh FERROCCL_BENCH OMPI_BENCH "NPS" "COLLS" "SIZES" ALTERNATIONS [extra bench args]
# prints "label npN coll size oop_us ip_us" lines.
set -u
FB=$1 OB=$2 NPS=$3 COLLS=$4 SIZES=$5 ALT=$6
shift 6
EXTRA="$*"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
iters() { # timed / warm-up iterations by size (bytes)
  if [ "$1" -ge $((4 << 20)) ]; then echo "-n 30 -w 5"; elif [ "$1" -ge $((1 << 20)) ]; then echo "-n 60 -w 8"; else echo "-n 200 -w 20"; fi
}
bytes() { numfmt --from=iec "$1"; }
line() { # label np coll size cmd...
  local label=$1 np=$2 coll=$3 size=$4; shift 4
  local out
  out=$(timeout 120 "$@" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ " | tail -1 | awk '{print $6, $10}')
  echo "$label np$np $coll $size ${out:-FAIL}"
}
for a in $(seq 1 "$ALT"); do
  for np in $NPS; do
    for coll in $COLLS; do
      for s in $SIZES; do
        b=$(bytes "$s"); it=$(iters "$b")
        line default "$np" "$coll" "$s" mpirun -np "$np" --bind-to none "$FB" "$coll" -b "$s" -e "$s" $it $EXTRA
        line slots "$np" "$coll" "$s" mpirun -np "$np" --bind-to none -x FERROCCL_NODE_STAGE_MAX=1G "$FB" "$coll" -b "$s" -e "$s" $it $EXTRA
        line memalloc "$np" "$coll" "$s" mpirun -np "$np" --bind-to none "$FB" "$coll" -b "$s" -e "$s" $it --alloc nccl $EXTRA
        line ompi "$np" "$coll" "$s" mpirun -np "$np" --bind-to none "$OB" -C "$coll" -b "$s" -e "$s" $it $EXTRA
      done
    done
  done
done
