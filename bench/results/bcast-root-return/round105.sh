#!/usr/bin/env bash
# Round 105 (device machine, 2026-12-06): malloc'd against ncclMemAlloc buffers at 8 and 16
# ranks, 8 KiB-2 MiB, all four collectives, with and without --fresh-inputs (each rank
# rewrites its input before every call, as an application with new data would), alternating
# the buffer kinds, three times. Carry .dev (ferroccl-bench with --fresh-inputs).
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; } > $R/host.txt 2>&1
B=$PWD/.dev/bin/ferroccl-bench
for np in 16 8; do for c in broadcast all_reduce all_gather reduce_scatter; do for i in 1 2 3; do
  for f in "" --fresh-inputs; do for a in system nccl; do
    printf "np%-2s %-14s %-6s %-14s " $np $c $a "${f:-reused}"
    timeout 60 mpirun -np $np --bind-to none $B $c -b 8K -e 2M -f 4 -n 100 -w 10 --alloc $a $f 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s  ", $1, $6} /[Ee]rror|failed|panick/{print}'
    echo
  done; done
done; done; done > $R/fresh.txt 2>&1
el launches
awk '{k=$1" "$2" "$3" "$4; for(j=5;j<NF;j+=2){kk=k" "$j; if(!(kk in b)||$(j+1)<b[kk])b[kk]=$(j+1)}} END{for(k in b)print k, b[k]}' $R/fresh.txt | sort -k1,1 -k2,2 -k4,4 -k5,5n -k3,3 > $R/fresh-best.txt
cat $R/fresh-best.txt
el done
