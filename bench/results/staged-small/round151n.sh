#!/usr/bin/env bash
# Round 151, NCCL part (device machine, 2026-12-07): NCCL 2.28 refuses two ranks on one GPU
# ("invalid usage", round 151's first try); with a distinct NCCL_HOSTID per rank it treats them
# as two hosts and goes over sockets, as the reference figures were taken. Same
# nccl-tests binaries (built against ferroccl's header; rpath $ORIGIN only, so without
# LD_LIBRARY_PATH they load the system's NCCL 2.28.3).
set -u; R=$OUT/n; mkdir -p $R; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; SRC=$PWD/.dev/nccl-tests
make -C $SRC -j12 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PWD/.dev/prefix NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR=/tmp/f >/tmp/f.log 2>&1; echo build $?
SOCK="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
W='exec env NCCL_HOSTID=h$OMPI_COMM_WORLD_RANK "$@"'
timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 $SOCK bash -c "$W" _ /tmp/f/all_reduce_perf -b 8 -e 64K -f 2 -c 0 -n 50 -w 10 > $R/nccl-small.log 2>&1; echo small $?
timeout 90 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 $SOCK bash -c "$W" _ /tmp/f/all_reduce_perf -b 256K -e 64M -f 4 -c 0 -n 10 -w 3 > $R/nccl-mid.log 2>&1; echo mid $?
timeout 30 /tmp/f/all_reduce_perf -b 8 -e 64K -f 2 -c 0 -n 50 -w 10 > $R/nccl-1rank.log 2>&1; echo one $?
for f in nccl-small nccl-mid nccl-1rank; do echo "== $f"; grep -E "^ +[0-9]+ |WARN|failure" $R/$f.log | awk '{print $1, $6, $10}' | head -20 | tr '\n' ';'; echo; done
