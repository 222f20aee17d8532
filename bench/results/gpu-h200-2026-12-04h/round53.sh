#!/usr/bin/env bash
# Round 53 (final build of the session): GPU tests and nccl-tests correctness; 2- and 4-rank
# all_gather / broadcast / reduce_scatter / all_reduce at 256 MiB-1 GiB against the copy
# ceiling; issue 15 on the 16-core host: the small-call path against Open MPI (2 and 4 ranks,
# 8 B-16 KiB) and the single cells left below 1.0x (8-rank reduce-scatter 16-64 KiB, 4-rank
# all-gather and broadcast 64-128 MiB); the staged path with the kernel's TCP counters around
# each run (are the stalls retransmissions?).
set -u
T0=$(date +%s)
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
( make -C $SRC -j14 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
nvcc -O2 $GEN bench/gpu/copy_bw.cu -o $BUILD/copy_bw > $R/copy_build.txt 2>&1; echo "copy_bw build rc=$?"
nvcc -O2 $GEN -I$PFX/include bench/gpu/staged_bw.cu -I$MPI_HOME/include -L$MPI_HOME/lib -L$PFX/lib -lnccl -lmpi -o $BUILD/staged_bw > $R/staged_build.txt 2>&1; echo "staged_bw build rc=$?"
( LD_LIBRARY_PATH=$PFX/lib timeout 150 .dev/it cuda --test-threads 1 > $R/it-cuda.txt 2>&1; echo "it cuda rc=$?" )
grep -E "test result|panicked|FAILED" $R/it-cuda.txt | head -20
wait
el "built + it"
F=$BUILD/f
run() { # label np bin args
  local l=$1 np=$2 b=$3; shift 3
  timeout 120 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib $b "$@" > $R/$l.log 2>&1
  echo "$l rc=$? $(grep -E 'Out of bounds' $R/$l.log | awk '{print $(NF-1), $NF}') $(grep -cE '^ +[0-9]+ ' $R/$l.log) rows; wrong: $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {print $9, $13}' $R/$l.log | sort -u | tr '\n' ' ')"
}
for c in all_reduce broadcast reduce_scatter all_gather; do run chk-$c-np4 4 $F/${c}_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1; done
run chk-sendrecv-np2 2 $F/sendrecv_perf -b 8 -e 64M -f 8 -c 1 -n 2 -w 1
el "correctness"
$BUILD/copy_bw > $R/copy_bw.txt 2>&1; tail -2 $R/copy_bw.txt
for np in 2 4; do for c in all_gather broadcast reduce_scatter all_reduce; do
  run big-$c-np$np $np $F/${c}_perf -b 256M -e 1G -f 2 -c 1 -n 10 -w 3
  grep -E '^ +[0-9]+ ' $R/big-$c-np$np.log | awk '{printf "  %s:%s GB/s (ip %s) ", $1, $8, $12} END {print ""}'
done; done
$BUILD/copy_bw > $R/copy_bw-2.txt 2>&1; tail -2 $R/copy_bw-2.txt
el "2/4 ranks large"
cmp() { local l=$1; shift
  timeout 200 bench/compare_ompi.sh "$@" --no-build --ferroccl-bench $PWD/.dev/bin/ferroccl-bench --timeout 60 --out $R/$l > $R/$l.txt 2>&1; echo "compare $l rc=$?"; }
cmp small -np 2,4 --sizes 8:16K --factor 2 --repeat 3 --colls all_reduce,broadcast
grep -A6 "^| ranks | collective" $R/small.md
OLD=$PWD/.dev/bin/ferroccl-bench-c1c4ebd NEW=$PWD/.dev/bin/ferroccl-bench
ab() { local l=$1 bin=$2; shift 2
  timeout 60 mpirun -np 2 --bind-to none $bin "$@" > $R/ab-$l.txt 2>&1
  echo "ab $l rc=$? $(awk '$1 ~ /^[0-9]+$/ {printf "%s:%s ", $1, $6}' $R/ab-$l.txt)"; }
for rep in 1 2 3; do for c in broadcast all_reduce; do
  ab $c-old-$rep $OLD $c -b 8 -e 2K -f 4 -n 20000 -w 1000
  ab $c-new-$rep $NEW $c -b 8 -e 2K -f 4 -n 20000 -w 1000
done; done
cmp rs8 -np 8 --sizes 16K:64K --factor 2 --repeat 3 --colls reduce_scatter
cmp big4 -np 4 --sizes 64M:128M --factor 2 --repeat 2 --colls all_gather,broadcast
el "compare"
snap() { awk '/^TcpExt:/ {if (!h) {split($0, k); h=1} else {for (i=2;i<=NF;i++) print k[i], $i}}' /proc/net/netstat; awk '/^Tcp:/ {if (!t) {split($0, k); t=1} else {for (i=2;i<=NF;i++) print k[i], $i}}' /proc/net/snmp; }
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
for rep in 1 2 3; do
  snap > $BUILD/n0
  timeout 100 mpirun -np 2 --bind-to none -x LD_LIBRARY_PATH=$PFX/lib $SOCK $BUILD/staged_bw 1 16 > $R/staged-$rep.txt 2>&1
  rc=$?; snap > $BUILD/n1
  echo "== staged $rep rc=$rc $(join $BUILD/n0 $BUILD/n1 | awk '$1 ~ /OFOQueue|RetransSegs|LossProbes|FastRetrans|InSegs/ {printf "%s +%d ", $1, $3-$2}')"
  grep -v "^\[" $R/staged-$rep.txt | grep -v NCCL | grep -v "^#  " | tail -5
done
el "staged"
cd $OUT && tar czf r.tgz r && rm -rf r
