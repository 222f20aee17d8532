#!/usr/bin/env bash
# The CMake build (CMakeLists.txt) against the make build: configure + build with the same
# TLS_BACKEND/MPI (cargo target dir shared, so cargo finds the crate fresh), staged files,
# `cmake --install --prefix` gives the same tree as `make install` (file list, link targets,
# identical cmake package files, pkg-config files equal but for the prefix), DESTDIR, and a
# consumer built against the cmake-installed prefix.
# One line per check, then "N passed, M failed"; exits non-zero on failure.
source "$(dirname "$0")/lib.sh"

load_build_env "$BUILDDIR" || exit 1
have "$CMAKE" || { skip "all CMake checks" "$CMAKE not found"; summary; exit $?; }
B=$WORK/build-cmake
MPI_OPT=OFF
[ "$FERROCCL_WITH_MPI" = 1 ] && MPI_OPT=ON
IB_OPT=OFF
[ "${FERROCCL_WITH_IB:-0}" = 1 ] && IB_OPT=ON
echo "== test-cmake: TLS_BACKEND='$FERROCCL_TLS_BACKEND' FERROCCL_MPI=$MPI_OPT, CARGO_TARGET_DIR=$CARGO_TARGET_DIR"

check "cmake configure (-DTLS_BACKEND='$FERROCCL_TLS_BACKEND' -DFERROCCL_MPI=$MPI_OPT)" \
  "$CMAKE" -S "$SRCDIR" -B "$B" -DTLS_BACKEND="$FERROCCL_TLS_BACKEND" -DFERROCCL_MPI=$MPI_OPT -DFERROCCL_IB=$IB_OPT \
    -DFERROCCL_CARGO_TARGET_DIR="$CARGO_TARGET_DIR" || { summary; exit 1; }
check "cmake --build -j" "$CMAKE" --build "$B" -j "$(nproc)" || { summary; exit 1; }
check "cmake build staged lib/ and include/ like make" bash -c "
  for f in lib/libferroccl.so lib/libnccl.so.2 lib/libnccl.so lib/libferroccl.a lib/libnccl.a include/nccl.h native-static-libs.txt; do
    [ -e '$B/'\$f ] || { echo \"missing \$f\"; exit 1; }; done
  [ \"\$(readlink '$B/lib/libnccl.so.2')\" = libferroccl.so ] && [ \"\$(readlink '$B/lib/libnccl.so')\" = libnccl.so.2 ]"
check "cmake and make staged the same library (same features, shared target dir)" \
  cmp "$B/lib/libferroccl.so" "$BUILDDIR/lib/libferroccl.so"
check "cmake and make found the same native static libs" \
  cmp "$B/native-static-libs.txt" "$BUILDDIR/native-static-libs.txt"
check "second cmake --build does not recompile the crate" \
  bash -c "out=\$('$CMAKE' --build '$B' 2>&1); echo \"\$out\"; ! echo \"\$out\" | grep -q 'Compiling ferroccl'"

check "cmake --install --prefix <tmp>" "$CMAKE" --install "$B" --prefix "$WORK/cmake-prefix"
check "make install PREFIX=<tmp> (same options)" \
  "$MAKE" -C "$SRCDIR" --no-print-directory BUILDDIR="$BUILDDIR" TLS_BACKEND="$FERROCCL_TLS_BACKEND" \
    MPI="$FERROCCL_WITH_MPI" IB="${FERROCCL_WITH_IB:-0}" install PREFIX="$WORK/make-prefix"
tree() { (cd "$1" && find . \( -type f -printf '%P file\n' \) -o \( -type l -printf '%P -> %l\n' \) | sort); }
check "cmake --install and make install give the same tree (files and link targets)" \
  diff -u <(tree "$WORK/make-prefix") <(tree "$WORK/cmake-prefix")
check "identical ferrocclConfig.cmake and ferrocclConfigVersion.cmake" bash -c "
  diff -u '$WORK/make-prefix/lib/cmake/ferroccl/ferrocclConfig.cmake' '$WORK/cmake-prefix/lib/cmake/ferroccl/ferrocclConfig.cmake' &&
  diff -u '$WORK/make-prefix/lib/cmake/ferroccl/ferrocclConfigVersion.cmake' '$WORK/cmake-prefix/lib/cmake/ferroccl/ferrocclConfigVersion.cmake'"
check "ferroccl.pc files equal but for the prefix line" \
  diff -u <(grep -v '^prefix=' "$WORK/make-prefix/lib/pkgconfig/ferroccl.pc") \
          <(grep -v '^prefix=' "$WORK/cmake-prefix/lib/pkgconfig/ferroccl.pc")
check "cmake-installed ferroccl.pc has prefix=<install prefix>" \
  grep -qx "prefix=$WORK/cmake-prefix" "$WORK/cmake-prefix/lib/pkgconfig/ferroccl.pc"
check "cmake --install with DESTDIR" bash -c "
  DESTDIR='$WORK/dest' '$CMAKE' --install '$B' --prefix /opt/ferroccl >/dev/null &&
  [ -f '$WORK/dest/opt/ferroccl/lib/libferroccl.so' ] && [ -L '$WORK/dest/opt/ferroccl/lib/libnccl.so.2' ] &&
  grep -qx 'prefix=/opt/ferroccl' '$WORK/dest/opt/ferroccl/lib/pkgconfig/ferroccl.pc'"

# A consumer against the cmake-installed prefix (C shared + Fortran).
fortran=OFF
{ have "$MPIF90" || have "$FC"; } && fortran=ON
check "consumer against the cmake-installed prefix: configure + build" bash -c "
  '$CMAKE' -S '$SRCDIR/tests/packaging/consumer' -B '$WORK/consumer' -DCMAKE_PREFIX_PATH='$WORK/cmake-prefix' \
    -DCONSUMER_FORTRAN=$fortran -DCONSUMER_STATIC=OFF && '$CMAKE' --build '$WORK/consumer' -j $(nproc)" &&
  check "consumer c_shared runs" "$WORK/consumer/c_shared"

summary
