#!/usr/bin/env bash
# Round 148 (device machine, 16-core host; 2026-12-07): the 16-rank all-gather launches that run
# 2.5-10x slow at 128-512 KiB when ranks are not bound to cores (app-arrays-2026-12-07.md,
# finding 3; round 145: 1 unbound launch of 8, 0 of 8 bound).
# A: is a slow launch slow all through, or only at its start? Each launch runs 8 cycles
#    (-N 8) of 2000 calls of a 256 KiB array, every cycle printed. Per-CPU busy time from
#    /proc/stat every 50 ms (a CPU idle while 16 ranks poll means two ranks share a core), and
#    in the second half of the launches a thread snapshot (ps -eLo psr) every 400 ms. Before
#    each launch, the cache-line round trip from CPU 0 to every other CPU (bench/
#    pingpair.c, 50 ms each): on the 2-core VM the two vCPUs' distance flips between about 130
#    and 520 ns as the host moves them, and the slot path runs 3.5x slower in the far periods.
# B: FERROCCL_SHARE_HEAP=1 (opt-in) against the default, ncclMemAlloc and Open MPI in
#    application-sized arrays (-b S -e S), all-reduce at 2, 8 and 16 ranks.
# Build: HEAD (cargo build --release -p ferroccl-bench, stripped) as .dev/bin/fb-head;
# carry [".dev/bin", ".dev/build.commit"].
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r; date -u; cat /sys/kernel/mm/transparent_hugepage/enabled; cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null; ls /sys/kernel/debug/sched 2>/dev/null | head; } > $R/host.txt 2>&1
mpicc -O2 -o /tmp/ompi_bench bench/ompi_bench.c || echo "ompi_bench build failed"
gcc -O2 -pthread -o /tmp/pingpair bench/pingpair.c || echo "pingpair build failed"
lscpu > $R/lscpu.txt 2>&1; lscpu -e >> $R/lscpu.txt 2>&1
prow() { echo -n "   pp0 "; for j in $(seq 1 15); do echo -n "$(/tmp/pingpair 0 $j 0.05) "; done; echo; }
prow > $R/pp-first.txt
for a in 0 4 8 12; do echo -n "from $a: "; for j in $(seq 0 15); do [ $j = $a ] && { echo -n "- "; continue; }; echo -n "$(/tmp/pingpair $a $j 0.03) "; done; echo; done >> $R/pp-first.txt
B=$PWD/.dev/bin/fb-head
statloop() { while :; do echo "T $(date +%s.%N)"; grep '^cpu[0-9]' /proc/stat; sleep 0.05; done; }
psloop() { while :; do echo "T $(date +%s.%N)"; ps -eLo pid,tid,psr,stat,pcpu,comm --no-headers | grep -E 'fb-head|ompi_bench|mpirun|prte|orted'; sleep 0.4; done; }
launch() { local l=$1 bind=$2; shift 2
  echo "== $l start $(date +%s.%N)"
  timeout 60 mpirun -np 16 --bind-to $bind "$@" 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{print "   ", $6, $10} /[Ee]rror|failed|panick/{print}'
  echo "== $l end $(date +%s.%N)"
}
statloop > $R/stat.txt 2>&1 & SP=$!
for i in $(seq 1 14); do
  before 120 || break
  prow
  [ $i -gt 7 ] && { psloop >> $R/ps.txt 2>&1 & PP=$!; }
  launch def-none-$i none $B all_gather -b 256K -e 256K -n 2000 -w 10 -N 8
  [ $i -gt 7 ] && kill $PP
  if [ $((i % 4)) = 0 ]; then
    launch def-core-$i core $B all_gather -b 256K -e 256K -n 2000 -w 10 -N 8
    launch ompi-none-$i none /tmp/ompi_bench -C all_gather -b 256K -e 256K -n 2000 -w 10
  fi
done 2>&1 | tee $R/stall.txt
kill $SP
el "part A done"
line() {  # label np size program and its arguments
  local l=$1 np=$2 s=$3; shift 3
  printf "%-6s np%-2s all_reduce %-5s " $l $np $s
  timeout 60 mpirun -np $np --bind-to none "$@" -b $s -e $s -n 40 -w 5 2>&1 | awk '/^ +[0-9]+ +[0-9]+ /{printf "%s %s", $6, $10} /[Ee]rror|failed|panick/{print}'
  echo
}
for rep in 1 2; do for np in 2 8 16; do for s in 1M 2M 4M 8M; do
  before 170 || break 3
  line def $np $s $B all_reduce
  line heap $np $s -x FERROCCL_SHARE_HEAP=1 $B all_reduce
  line mem $np $s $B all_reduce --alloc nccl
  line ompi $np $s /tmp/ompi_bench -C all_reduce
done; done; done 2>&1 | tee $R/heap.txt
el end
cd $OUT && tar czf r.tgz r && rm -rf r
