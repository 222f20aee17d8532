#!/usr/bin/env bash
# Round 88 (16-core host of the GPU machine, build in .dev): does the buffer's size decide the
# 16-rank reduce-scatter at 32-512 KiB? compare_ompi.sh ran ompi_bench over one 128 MiB buffer
# but ferroccl-bench per segment (sizes up to 512 KiB in a 512 KiB buffer). Here both programs
# run the same sizes in a 512 KiB and in a 128 MiB buffer, 3 alternating launches.
set -u
R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime
  for f in enabled defrag khugepaged/defrag; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done
  grep -i huge /proc/meminfo; uname -r; } > $R/host.txt 2>&1
cat $R/host.txt
FB=.dev/bin/ferroccl-bench
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
run() { timeout 150 mpirun -np 16 --oversubscribe --bind-to none -x NCCL_SOCKET_IFNAME=lo "$@" 2>&1 | grep -E "^ +[0-9]" | awk '$1>=32768 && $1<=524288 {printf "%s %s  ", $1/1024, $6}'; echo; }
for rep in 1 2 3; do
  for v in fb-512K om-512K fb-128M om-128M; do
    printf "rs np16 rep$rep %-8s " $v
    case $v in
      fb-512K) run $FB reduce_scatter -b 32K -e 512K -f 2 -n 100 -w 10 -c 0 ;;
      om-512K) run /tmp/ompi_bench -C reduce_scatter -b 32K -e 512K -f 2 -n 100 -w 10 -c 0 ;;
      fb-128M) run $FB reduce_scatter -b 32K -e 128M -f 2 -n 100 -w 10 -c 0 ;;
      om-128M) run /tmp/ompi_bench -C reduce_scatter -b 32K -e 128M -f 2 -n 100 -w 10 --tier 1M:20:5 --tier 64M:5:2 -c 0 ;;
    esac
  done
done > $R/rs16.txt 2>&1
cat $R/rs16.txt
cd $OUT && tar czf r.tgz r && rm -rf r
