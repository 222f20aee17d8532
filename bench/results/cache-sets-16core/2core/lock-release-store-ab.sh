export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for rep in 1 2 3 4 5 6; do for v in skew lock; do for c in broadcast all_reduce; do
  printf "%s %s rep$rep " $c $v
  timeout 60 mpirun -np 2 --bind-to core /tmp/fb-$v $c -b 8 -e 512 -f 4 -n 50000 -w 1000 -c 0 2>&1 | grep -E "^ +[0-9]" | awk '{printf "%s %s/%s  ", $1, $6, $10}'; echo
done; done; done
