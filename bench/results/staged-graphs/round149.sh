#!/usr/bin/env bash
# Round 149 (device machine, 2026-12-07): staged operations captured into CUDA graphs
# (coll::captured). (1) GPU tests (.dev/it cuda), which now capture and replay staged
# operations in processes over the staged path (cuda::staged_graphs, 2 and 3 ranks). (2)
# nccl-tests through the staged path over sockets (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1) with
# -G 10 (graph capture, 10 launches per measurement), every call checked (-c 1), against the
# all_reduce without -G: all_reduce, all_gather, reduce_scatter, broadcast at 2 ranks,
# all_reduce at 3.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
SRC=$PWD/.dev/nccl-tests
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L; uname -r; date -u; } > $R/host.txt 2>&1
cat $R/host.txt
( make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
timeout 200 .dev/it cuda --test-threads 1 --skip gpu_processes_staged > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head -20
wait
el "nccl-tests built"; tail -3 $BUILD/f.log
F=$BUILD/f
run() { # label np collective extra-args
  local l=$1 np=$2 t=$3; shift 3
  timeout 45 mpirun -np $np --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib \
    -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo -x NCCL_DEBUG=WARN \
    $F/${t}_perf -b 8 -e 32M -f 8 -c 1 -n 5 -w 2 "$@" > $R/$l-$t-np$np.log 2>&1
  echo "$l $t np$np rc=$? $(grep -E 'Out of bounds' $R/$l-$t-np$np.log | awk '{print $(NF-1), $NF}') wrong=$(awk '/^ +[0-9]+ /{w+=$9+$13} END{print w+0}' $R/$l-$t-np$np.log)"
}
for t in all_reduce all_gather reduce_scatter broadcast; do
  run graph 2 $t -G 10
done
run plain 2 all_reduce
run graph 3 all_reduce -G 10
el "nccl-tests"
timeout 120 .dev/it cuda::gpu_processes_staged --test-threads 1 > $R/gpu-staged.txt 2>&1; el "staged gpu test rc=$?"
grep -E "^test |^test result|panicked" $R/gpu-staged.txt | head
for f in $R/graph-all_reduce-np2.log $R/plain-all_reduce-np2.log; do echo "== $f"; grep -E "^ +[0-9]+ |Avg bus|WARN" $f | head -20; done
cd $OUT && tar czf r.tgz r && rm -rf r
