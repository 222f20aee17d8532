#!/usr/bin/env bash
# TLS_BACKEND matrix for make and cmake, each in its own staging/build dir under a scratch
# directory (the cargo target dir is shared: each feature flip rebuilds only the crate):
#   empty    -> builds, ldd shows no libssl/libcrypto; invalid_args: a valid PSK fails closed
#   OPENSSL3 -> builds, ldd shows libssl.so.3; invalid_args: a valid PSK is accepted
#   bogus    -> fails at once with "TLS_BACKEND must be empty or OPENSSL3, got '...'",
#               non-zero exit, nothing built (no staging dir, cargo not run, no build files)
#   OPENSSL3 without OpenSSL 3 dev files (simulated: PKG_CONFIG=false) -> clear error
# Also MPI=0 (make) -> no libmpi. One line per check, then "N passed, M failed".
source "$(dirname "$0")/lib.sh"

MPI_MODE=${FERROCCL_MPI:-auto}
STRICT="-Wall -Wextra -pedantic -Werror"
echo "== test-tls-matrix: CARGO_TARGET_DIR=$CARGO_TARGET_DIR MPI=$MPI_MODE"

# invalid_args against a staged build: the encryption checks depend on the backend.
run_invalid_args() { # label stagedir expect_tls
  local label=$1 dir=$2 tls=$3
  check "$label: invalid_args (FERROCCL_EXPECT_TLS=$tls)" bash -c "set -o pipefail
    '$CC' -std=c99 $STRICT -I'$dir/include' -o '$dir/invalid_args' '$SRCDIR/tests/c/invalid_args.c' -L'$dir/lib' -lnccl &&
    LD_LIBRARY_PATH='$dir/lib' FERROCCL_EXPECT_TLS=$tls '$dir/invalid_args' | grep -vE '^PASS'"
}

ldd_checks() { # label lib tls
  local label=$1 lib=$2 tls=$3
  if [ "$tls" = 1 ]; then
    check "$label: ldd shows libssl.so.3" bash -c "ldd '$lib'; ldd '$lib' | grep -q 'libssl\.so\.3'"
  else
    check "$label: ldd shows no libssl/libcrypto" bash -c "ldd '$lib'; ! ldd '$lib' | grep -Eq 'libssl|libcrypto'"
  fi
}

stamp() { stat -c %Y "$CARGO_TARGET_DIR/release/libferroccl.so" 2>/dev/null || echo none; }

# ---- make
for backend in "" OPENSSL3; do
  label="make TLS_BACKEND='$backend'"
  dir=$WORK/make-${backend:-none}
  if check "$label: build" "$MAKE" -C "$SRCDIR" --no-print-directory BUILDDIR="$dir" TLS_BACKEND="$backend" MPI="$MPI_MODE" all; then
    ldd_checks "$label" "$dir/lib/libferroccl.so" "$([ -n "$backend" ] && echo 1 || echo 0)"
    check "$label: build env records TLS" grep -qx "FERROCCL_WITH_TLS=$([ -n "$backend" ] && echo 1 || echo 0)" "$dir/ferroccl-build.env"
    run_invalid_args "$label" "$dir" "$([ -n "$backend" ] && echo 1 || echo 0)"
  fi
done
before=$(stamp)
check_fails "make TLS_BACKEND=bogus: fails with the clear message" \
  "TLS_BACKEND must be empty or OPENSSL3, got 'bogus'" \
  "$MAKE" -C "$SRCDIR" --no-print-directory BUILDDIR="$WORK/make-bogus" TLS_BACKEND=bogus all
check "make TLS_BACKEND=bogus: nothing built (no staging dir, cargo output untouched)" \
  bash -c "[ ! -e '$WORK/make-bogus' ] && [ '$(stamp)' = '$before' ]"
check_fails "make TLS_BACKEND=bogus install: refused too" "TLS_BACKEND must be empty or OPENSSL3" \
  "$MAKE" -C "$SRCDIR" --no-print-directory BUILDDIR="$WORK/make-bogus" TLS_BACKEND=bogus install PREFIX="$WORK/bogus-prefix"
check_fails "make TLS_BACKEND=OPENSSL3 without OpenSSL 3 dev files (PKG_CONFIG=false): clear error" \
  "needs the OpenSSL 3 development files" \
  "$MAKE" -C "$SRCDIR" --no-print-directory BUILDDIR="$WORK/make-nossl" TLS_BACKEND=OPENSSL3 PKG_CONFIG=false all
check "make, missing OpenSSL: cargo not run" bash -c "[ ! -e '$WORK/make-nossl/lib/libferroccl.so' ] && [ '$(stamp)' = '$before' ]"

if [ "$MPI_MODE" != 0 ]; then
  dir=$WORK/make-nompi
  if check "make MPI=0 TLS_BACKEND=: build" "$MAKE" -C "$SRCDIR" --no-print-directory BUILDDIR="$dir" TLS_BACKEND= MPI=0 all; then
    check "make MPI=0: ldd shows no libmpi and no libssl" bash -c "! ldd '$dir/lib/libferroccl.so' | grep -Eq 'libmpi|libssl'"
    check "make MPI=0: static libs have no -lmpi" bash -c "! grep -qw -- -lmpi '$dir/native-static-libs.txt'"
    check "make MPI=0: ferrocclCommInitMpi still exported (stable ABI)" \
      bash -c "nm -D --defined-only '$dir/lib/libferroccl.so' | grep -qw ferrocclCommInitMpi"
    # The CMake package without MPI: no MPI::MPI_C, Fortran module without mpi_f08.
    if check "make MPI=0: install" "$MAKE" -C "$SRCDIR" --no-print-directory BUILDDIR="$dir" TLS_BACKEND= MPI=0 \
         install PREFIX="$WORK/prefix-nompi" && have "$CMAKE"; then
      fortran=OFF
      have "$FC" && fortran=ON
      check "make MPI=0: cmake consumer (no MPI, Fortran=$fortran) configures and builds" bash -c "
        '$CMAKE' -S '$SRCDIR/tests/packaging/consumer' -B '$WORK/consumer-nompi' -DCMAKE_PREFIX_PATH='$WORK/prefix-nompi' \
          -DCONSUMER_MPI=OFF -DCONSUMER_FORTRAN=$fortran && '$CMAKE' --build '$WORK/consumer-nompi' -j $(nproc)" &&
        check "make MPI=0: consumer programs run (c_shared, c_static$([ $fortran = ON ] && echo ', f_version'))" bash -c "
          '$WORK/consumer-nompi/c_shared' && '$WORK/consumer-nompi/c_static' &&
          { [ $fortran = OFF ] || '$WORK/consumer-nompi/f_version'; }"
    fi
  fi
fi

# ---- cmake
if have "$CMAKE"; then
  mpi_opt=()
  [ "$MPI_MODE" = 0 ] && mpi_opt=(-DFERROCCL_MPI=OFF)
  [ "$MPI_MODE" = 1 ] && mpi_opt=(-DFERROCCL_MPI=ON)
  for backend in "" OPENSSL3; do
    label="cmake -DTLS_BACKEND='$backend'"
    b=$WORK/cmake-${backend:-none}
    if check "$label: configure" "$CMAKE" -S "$SRCDIR" -B "$b" -DTLS_BACKEND="$backend" "${mpi_opt[@]}" \
         -DFERROCCL_CARGO_TARGET_DIR="$CARGO_TARGET_DIR" &&
       check "$label: build" "$CMAKE" --build "$b" -j "$(nproc)"; then
      ldd_checks "$label" "$b/lib/libferroccl.so" "$([ -n "$backend" ] && echo 1 || echo 0)"
      run_invalid_args "$label" "$b" "$([ -n "$backend" ] && echo 1 || echo 0)"
    fi
  done
  before=$(stamp)
  check_fails "cmake -DTLS_BACKEND=bogus: configure fails with the clear message" \
    "TLS_BACKEND must be empty or OPENSSL3, got 'bogus'" \
    "$CMAKE" -S "$SRCDIR" -B "$WORK/cmake-bogus" -DTLS_BACKEND=bogus
  check "cmake -DTLS_BACKEND=bogus: nothing generated or built" \
    bash -c "[ ! -e '$WORK/cmake-bogus/Makefile' ] && [ ! -e '$WORK/cmake-bogus/build.ninja' ] && [ ! -e '$WORK/cmake-bogus/lib' ] && [ '$(stamp)' = '$before' ]"
  check_fails "cmake -DTLS_BACKEND=OPENSSL3 without OpenSSL 3 dev files (PKG_CONFIG_EXECUTABLE=false): clear error" \
    "needs the OpenSSL 3 development files" \
    "$CMAKE" -S "$SRCDIR" -B "$WORK/cmake-nossl" -DTLS_BACKEND=OPENSSL3 -DPKG_CONFIG_EXECUTABLE=/bin/false
  check_fails "cmake with TLS_BACKEND=bogus in the environment: validated too" \
    "TLS_BACKEND must be empty or OPENSSL3, got 'bogus'" \
    env TLS_BACKEND=bogus "$CMAKE" -S "$SRCDIR" -B "$WORK/cmake-envbogus"
else
  skip "cmake matrix" "$CMAKE not found"
fi

summary
