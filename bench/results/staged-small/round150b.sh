#!/usr/bin/env bash
# Round 150, the short form (the device budget left after nine refused starts): the same builds
# as round150.sh, in order of need: the staged GPU test (cuda::gpu_processes_staged, which runs
# cuda::staged_graphs: its 4 MiB all-reduce now replays piece by piece), nccl-tests -G 10 -c 1
# through the staged path (all_reduce to 32 MiB, which is cut into separate operations, and
# broadcast), replays a against b, the hand-off floor and small staged calls, then the other
# GPU tests.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ echo "b $(cat .dev/build.commit) a $(cat .dev/build-a.commit)"; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
( make -C .dev/nccl-tests -j14 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?"
  nvcc -O2 -I$MPI_HOME/include bench/gpu/handoff_floor.cu -lcuda -L$MPI_HOME/lib -lmpi -o $BUILD/handoff_floor > $BUILD/floor.log 2>&1; echo "floor build rc=$?" ) &
timeout 100 .dev/it cuda::gpu_processes_staged --test-threads 1 > $R/gpu-staged.txt 2>&1; el "staged gpu test rc=$?"
grep -E "^test |^test result|panicked|FAILED" $R/gpu-staged.txt | head
wait; el built
F=$BUILD/f
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
run() { # label np collective lib extra-args
  local l=$1 np=$2 t=$3 lib=$4; shift 4
  timeout 40 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/$lib/lib \
    $SOCK -x NCCL_DEBUG=WARN $F/${t}_perf "$@" > $R/$l-$t-np$np.log 2>&1
  local rc=$? wrong=$(awk '/^ +[0-9]+ /{w+=$9+$13} END{print w+0}' $R/$l-$t-np$np.log)
  echo "$l $t np$np rc=$rc $(grep -E 'Out of bounds' $R/$l-$t-np$np.log | awk '{print $(NF-1), $NF}') wrong=$wrong"
}
CHK="-b 8 -e 32M -f 8 -c 1 -n 5 -w 2"
run graph 2 all_reduce .dev/prefix $CHK -G 10
run graph 2 broadcast .dev/prefix $CHK -G 10
T="-b 1M -e 64M -f 4 -c 0 -n 10 -w 3"
run rep-a 2 all_reduce .dev/prefix-a $T -G 10
run rep-b 2 all_reduce .dev/prefix $T -G 10
run plain-b 2 all_reduce .dev/prefix $T
el replays
for f in rep-a rep-b plain-b; do echo "== $f $(grep -E '^ +[0-9]+ ' $R/$f-all_reduce-np2.log | awk '{printf "%s:%s/%s ", $1, $6, $10}')"; done
for a in "8 1" "8 2" "4096 2"; do set -- $a
  timeout 15 mpirun -np $2 --bind-to none $BUILD/handoff_floor $1 200 > $R/floor-$1-np$2.log 2>&1; echo "floor $1 np$2 rc=$? $(tail -1 $R/floor-$1-np$2.log)"
done
run small 2 all_reduce .dev/prefix -b 8 -e 64K -f 4 -c 0 -n 50 -w 10
timeout 20 mpirun -np 2 --bind-to none $SOCK .dev/fb all_reduce -b 8 -e 64K -f 4 -n 200 -w 20 > $R/host-small.log 2>&1; el "host small rc=$?"
for f in small-all_reduce-np2 host-small; do echo "== $f $(grep -E '^ +[0-9]+ ' $R/$f.log | awk '{printf "%s:%s/%s ", $1, $6, $10}')"; done
timeout 150 .dev/it cuda --test-threads 1 --skip gpu_processes_staged > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head -20
