#!/usr/bin/env bash
# Runs ferroccl's host benchmarks on a bigger host (the 16-core device machine), from binaries
# built elsewhere and carried in $BIN:
#   ferroccl-bench-tls    --features tls, linked to the system's libssl.so.3
#   ferroccl-bench-tls36  --features tls, OpenSSL 3.6 linked statically (OPENSSL_DIR=...
#                         OPENSSL_STATIC=1): the same code with a VAES/AVX-512 AES-GCM
#   ferroccl-bench-mpi    default features (MPI), for the Open MPI comparison
#
#   BIN=.devbin OUT=$OUT [REPEAT=1] [GIT_COMMIT=abc1234] bench/device_run.sh tls|ompi|all
#
# tls:  the encryption canary (2 ranks as threads, sockets only, 64 MiB float all-reduce,
#       plaintext then TLS) for both OpenSSL builds, with the default socket threading (striped
#       on 8+ cores, plaintext and TLS alike) and with NCCL_SOCKET_NTHREADS=0 (inline); then
#       plaintext latency and bandwidth, inline against striped.
# ompi: bench/compare_ompi.sh at 8 and 16 ranks, each pair of sweeps REPEAT times.
# GIT_COMMIT labels the results with the commit the binaries were built from (the copied
# tree's git metadata may be stale).
set -uo pipefail
part=${1:-all}
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/ferroccl-device}
mkdir -p "$OUT"
export NCCL_SOCKET_IFNAME=lo OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
  echo "# host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "# flags: $(grep -m1 -o -w -E 'vaes|vpclmulqdq|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "# date: $(date -u +%FT%TZ)"
  echo "# system OpenSSL: $(openssl version 2>&1)"
  echo "# mpirun: $(mpirun --version 2>&1 | head -1)"
} | tee -a "$OUT/host.txt"

if [ "$part" = tls ] || [ "$part" = all ]; then
  for b in tls tls36; do
    for threads in default 0; do
      name=canary-$b-threads-$threads
      echo "== $name"
      extra=()
      [ "$threads" = 0 ] && extra=(NCCL_SOCKET_NTHREADS=0)
      env NCCL_SHM_DISABLE=1 "${extra[@]}" timeout 200 "$BIN/ferroccl-bench-$b" all_reduce -t 2 --canary --max-loss 5 \
        -b 64M -e 64M -n 20 -w 5 >"$OUT/$name.txt" 2>&1
      echo "exit $?"
      grep -A4 '^# Encryption canary: all_reduce' "$OUT/$name.txt"
    done
  done
  for threads in default 0; do
    echo "== plaintext sockets, 2 ranks as threads, NCCL_SOCKET_NTHREADS=$threads"
    extra=()
    [ "$threads" = 0 ] && extra=(NCCL_SOCKET_NTHREADS=0)
    env NCCL_SHM_DISABLE=1 "${extra[@]}" timeout 200 "$BIN/ferroccl-bench-tls" all_reduce -t 2 -b 8 -e 64M -f 8 -n 20 -w 5 2>&1 |
      grep -E '^ +[0-9]|Avg bus'
  done
fi

if [ "$part" = ompi ] || [ "$part" = all ]; then
  for n in 8 16; do
    echo "== Open MPI comparison, $n ranks"
    timeout $((100 + 180 * ${REPEAT:-1})) bench/compare_ompi.sh -np $n --sizes 8:256M --factor 4 --no-build --repeat "${REPEAT:-1}" \
      --ferroccl-bench "$BIN/ferroccl-bench-mpi" --out "$OUT/ompi-compare-16core-np$n" 2>&1 | tail -30
  done
fi
