#!/usr/bin/env bash
# Runs ferroccl's host benchmarks on a bigger host (the 16-core device machine): the
# encryption canary (2 ranks, sockets only, 64 MiB float all-reduce, plaintext vs TLS) and the
# Open MPI comparison at 8 and 16 ranks. Binaries are built elsewhere and carried in $BIN.
#   BIN=.devbin OUT=$OUT bench/device_run.sh
set -uo pipefail
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/ferroccl-device}
mkdir -p "$OUT"
export NCCL_SOCKET_IFNAME=lo OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
  echo "# host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "# date: $(date -u +%FT%TZ)"
  echo "# mpirun: $(mpirun --version 2>&1 | head -1)"
  ldd "$BIN/ferroccl-bench-mpi" | grep -E "not found|libmpi" || true
} | tee "$OUT/host.txt"

echo "== canary: 2 ranks as threads, sockets only, plaintext then TLS (64 MiB float all-reduce)"
NCCL_SHM_DISABLE=1 timeout 300 "$BIN/ferroccl-bench-tls" all_reduce -t 2 --canary --max-loss 5 \
  -b 64M -e 64M -n 20 -w 5 -J "$OUT/canary-16core.json" 2>&1 | tee "$OUT/canary-16core.txt" | tail -25

if "$BIN/ferroccl-bench-mpi" --help >/dev/null 2>&1; then
  for n in 8 16; do
    echo "== Open MPI comparison, $n ranks"
    timeout 420 bench/compare_ompi.sh -np $n --sizes 8:256M --factor 4 --no-build \
      --ferroccl-bench "$BIN/ferroccl-bench-mpi" --out "$OUT/ompi-compare-16core-np$n" 2>&1 | tail -40
  done
else
  echo "the MPI build of the benchmark cannot run here (MPI library mismatch); skipping"
fi
