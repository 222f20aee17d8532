set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
X=$PWD/.dev/exp/ferroccl-bench-exp
for np in 16 8; do for i in 1 2 3; do for m in 0 1 2 3; do
  printf "mode%s np%-2s " $m $np
  timeout 60 mpirun -np $np --bind-to none -x EXP_BCAST=$m $X broadcast -b 32K -e 2M -f 4 -n 200 -w 20 -c 1 2>&1 | awk '/^ +[0-9]+ /{printf "%s %s/%s  ", $1, $6, $8} /[Ee]rror|failed/{print}'
  echo
done; done; done
