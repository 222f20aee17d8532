export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for rep in 1 2 3 4; do for v in noskew skew; do for NP in 2 4; do for c in reduce_scatter all_reduce; do
  printf "%s np$NP %s rep$rep " $c $v
  timeout 120 mpirun -np $NP --bind-to none /tmp/fb-$v $c -b 32K -e 8M -f 4 -n 50 -w 5 -c 1 2>&1 | grep -E "^ +[0-9]" | awk '{printf "%s %s/%s/w%s%s  ", $1, $6, $10, $9, $13}'; echo
done; done; done; done
