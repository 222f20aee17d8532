#!/usr/bin/env bash
# The demo: installs the dependencies, builds ferroccl with TLS support, shows what it sees,
# then runs NCCL programs on it: a C MPI all-reduce on 4 ranks (classic unique id + MPI_Bcast),
# a communicator made straight from MPI communicators, a Fortran program, and the benchmark.
# Only loopback is used (NCCL_SOCKET_IFNAME=lo) unless you set NCCL_SOCKET_IFNAME yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1

echo "==== build (make TLS_BACKEND=OPENSSL3)"
make -s TLS_BACKEND=OPENSSL3
cargo build -q --release -p ferroccl-bench --features tls
inc=build/include lib=build/lib
out=build/demo && mkdir -p "$out"
mpicc -O2 -I"$inc" examples/c/allreduce_mpi.c -L"$lib" -lnccl -Wl,-rpath,"$PWD/$lib" -o "$out/allreduce_mpi"
mpicc -O2 -I"$inc" examples/c/init_mpi.c -L"$lib" -lnccl -Wl,-rpath,"$PWD/$lib" -o "$out/init_mpi"

echo
echo "==== what ferroccl is (version, build options, transports it picks), 4 ranks"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,P2P,GRAPH mpirun -np 4 "$out/allreduce_mpi" 2>&1 \
  | grep -E "NCCL version|Using network|NET/|via|GRAPH|Init COMPLETE|allreduce_mpi" | sort -u | head -40

echo
echo "==== communicators straight from MPI communicators (ferrocclCommInitMpi), 4 ranks"
mpirun -np 4 "$out/init_mpi"

if command -v mpif90 >/dev/null; then
  echo
  echo "==== Fortran (use mpi), 2 ranks"
  mpif90 -O2 -I"$inc" fortran/ferroccl.F90 examples/fortran/allreduce.f90 -J "$out" -L"$lib" -lnccl \
    -Wl,-rpath,"$PWD/$lib" -o "$out/allreduce_f"
  mpirun -np 2 "$out/allreduce_f"
fi

echo
echo "==== benchmark: all-reduce, 2 processes on this host (shared memory), 8 B .. 64 MiB"
mpirun -np 2 target/release/ferroccl-bench all_reduce -b 8 -e 64M -f 8 -n 10 -w 3
