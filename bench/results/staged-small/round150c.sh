#!/usr/bin/env bash
# Round 150, the shortest form (under 400 s of device time left after the refusals of two
# sessions): the GPU tests of build b first (cuda::gpu_processes_staged runs cuda::staged_graphs:
# its 4 MiB all-reduce replays piece by piece, then six capture/destroy cycles), then nccl-tests
# -G 10 -c 1 through the staged path (all_reduce to 32 MiB, cut into separate operations), then
# the rest of the GPU tests. Partial results come back in $OUT/r if time runs out.
set -u
T0=$(date +%s); R=$OUT/r; BUILD=/tmp/b; mkdir -p $R $BUILD
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
{ echo "b $(cat .dev/build.commit)"; nproc; nvidia-smi -L; date -u; } > $R/host.txt 2>&1; cat $R/host.txt
( make -C .dev/nccl-tests -j14 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?" ) &
timeout 60 .dev/it cuda::gpu_processes_staged --test-threads 1 > $R/gpu-staged.txt 2>&1; el "staged gpu test rc=$?"
grep -E "^test |^test result|panicked|FAILED" $R/gpu-staged.txt | head
wait; el built
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
for t in all_reduce broadcast; do
  timeout 40 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PWD/.dev/prefix/lib $SOCK -x NCCL_DEBUG=WARN \
    $BUILD/f/${t}_perf -b 8 -e 32M -f 8 -c 1 -n 5 -w 2 -G 10 > $R/graph-$t-np2.log 2>&1
  echo "graph $t rc=$? $(grep 'Out of bounds' $R/graph-$t-np2.log) wrong=$(awk '/^ +[0-9]+ /{w+=$9+$13} END{print w+0}' $R/graph-$t-np2.log)"
  grep -E "^ +[0-9]+ " $R/graph-$t-np2.log | awk '{printf "%s:%s/%s ", $1, $6, $10}'; echo
done
el "nccl-tests"
timeout 120 .dev/it cuda --test-threads 1 --skip gpu_processes_staged > $R/gpu-tests.txt 2>&1; el "gpu tests rc=$?"
grep -E "^test result|FAILED|panicked" $R/gpu-tests.txt | head -20
