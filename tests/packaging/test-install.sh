#!/usr/bin/env bash
# `make install` and its consumers: installed tree, pkg-config (shared and static link),
# a CMake consumer project (C shared, C static, Fortran via ferroccl::fortran, MPI programs
# under mpirun -np 2), the installed .mod + libferroccl_fortran.a, a relocated prefix, DESTDIR.
# Installs the build in $FERROCCL_BUILDDIR with the same TLS_BACKEND/MPI (no rebuild).
# One line per check, then "N passed, M failed"; exits non-zero on failure.
source "$(dirname "$0")/lib.sh"

load_build_env "$BUILDDIR" || exit 1
P=$WORK/prefix
MAKEARGS=(-C "$SRCDIR" --no-print-directory BUILDDIR="$BUILDDIR" TLS_BACKEND="$FERROCCL_TLS_BACKEND" MPI="$FERROCCL_WITH_MPI" IB="${FERROCCL_WITH_IB:-0}")
echo "== test-install: $BUILDDIR -> $P (features: ${FERROCCL_FEATURES:-none})"

check "make install PREFIX=<tmp>" "$MAKE" "${MAKEARGS[@]}" install PREFIX="$P" || { summary; exit 1; }

# ---- the tree
expected=(lib/libferroccl.so lib/libnccl.so.2 lib/libnccl.so lib/libferroccl.a lib/libnccl.a include/nccl.h
          share/ferroccl/fortran/ferroccl.F90 lib/cmake/ferroccl/ferrocclConfig.cmake
          lib/cmake/ferroccl/ferrocclConfigVersion.cmake lib/pkgconfig/ferroccl.pc)
if have "$MPIF90" || have "$FC"; then
  expected+=(include/ferroccl.mod lib/libferroccl_fortran.a)
fi
check "installed files present (${#expected[@]})" bash -c "cd '$P' && for f in ${expected[*]}; do [ -e \"\$f\" ] || { echo \"missing \$f\"; exit 1; }; done"
check "installed links: libnccl.so -> libnccl.so.2 -> libferroccl.so, libnccl.a -> libferroccl.a" \
  bash -c "[ \"\$(readlink '$P/lib/libnccl.so')\" = libnccl.so.2 ] && [ \"\$(readlink '$P/lib/libnccl.so.2')\" = libferroccl.so ] && [ \"\$(readlink '$P/lib/libnccl.a')\" = libferroccl.a ]"
check "no unsubstituted @VARS@ in the generated cmake/pkg-config files" \
  bash -c "! grep -n '@[A-Z_]*@' '$P/lib/cmake/ferroccl/'*.cmake '$P/lib/pkgconfig/ferroccl.pc'"

# ---- pkg-config
export PKG_CONFIG_PATH=$P/lib/pkgconfig
if have "$PKG_CONFIG"; then
  check "pkg-config --validate ferroccl" "$PKG_CONFIG" --validate ferroccl
  check "pkg-config --modversion ferroccl = $FERROCCL_VERSION" \
    bash -c "[ \"\$('$PKG_CONFIG' --modversion ferroccl)\" = '$FERROCCL_VERSION' ]"
  check "pkg-config --libs = -L<prefix>/lib -lnccl, --cflags = -I<prefix>/include" \
    bash -c "libs=\$(echo \$('$PKG_CONFIG' --libs ferroccl)); cflags=\$(echo \$('$PKG_CONFIG' --cflags ferroccl)); echo \"libs='\$libs' cflags='\$cflags'\"; [ \"\$libs\" = '-L$P/lib -lnccl' ] && [ \"\$cflags\" = '-I$P/include' ]"
  check "pkg-config --static --libs carries the native static libs" \
    bash -c "out=\$('$PKG_CONFIG' --static --libs ferroccl); echo \"\$out\"; for l in $FERROCCL_NATIVE_STATIC_LIBS; do case \" \$out \" in *\" \$l \"*) ;; *) echo \"missing \$l\"; exit 1;; esac; done"
  check "pkg-config variables with_tls=$FERROCCL_WITH_TLS with_mpi=$FERROCCL_WITH_MPI nccl_version=<header's>" \
    bash -c "[ -n \"\$('$PKG_CONFIG' --variable=nccl_version ferroccl)\" ] && [ \"\$('$PKG_CONFIG' --variable=with_tls ferroccl)\" = '$FERROCCL_WITH_TLS' ] && [ \"\$('$PKG_CONFIG' --variable=with_mpi ferroccl)\" = '$FERROCCL_WITH_MPI' ]"
  check "pkg-config link (shared): cc version.c \$(pkg-config --cflags --libs ferroccl)" \
    bash -c "'$CC' -std=c99 -Wall -Werror -o '$WORK/pc-shared' '$SRCDIR/tests/c/version.c' \$('$PKG_CONFIG' --cflags --libs ferroccl)" &&
    check "pc-shared runs (LD_LIBRARY_PATH=<prefix>/lib)" env LD_LIBRARY_PATH="$P/lib" "$WORK/pc-shared"
  check "pkg-config link (static): -l:libnccl.a \$(pkg-config --static --libs-only-l ...)" \
    bash -c "'$CC' -std=c99 -Wall -Werror -o '$WORK/pc-static' '$SRCDIR/tests/c/version.c' \$('$PKG_CONFIG' --cflags ferroccl) \
      \$('$PKG_CONFIG' --libs-only-L --static ferroccl) -l:libnccl.a \$('$PKG_CONFIG' --static --libs-only-l ferroccl | sed 's/-lnccl //')" &&
    check "pc-static runs without libnccl.so" bash -c "! ldd '$WORK/pc-static' | grep -q libnccl && '$WORK/pc-static'"
else
  skip "pkg-config checks" "$PKG_CONFIG not found"
fi

# ---- installed Fortran module (.mod + libferroccl_fortran.a, same compiler)
if [ -f "$P/include/ferroccl.mod" ]; then
  if [ "$FERROCCL_WITH_MPI" = 1 ]; then fc=$MPIF90; else fc=$FC; fi
  check "installed .mod: $fc version.f90 -I<prefix>/include -lferroccl_fortran -lnccl" \
    bash -c "cd '$WORK' && '$fc' -I'$P/include' -o '$WORK/mod-version' '$SRCDIR/tests/fortran/version.f90' -L'$P/lib' -lferroccl_fortran -lnccl -Wl,-rpath,'$P/lib'" &&
    check "mod-version runs" "$WORK/mod-version"
fi

# ---- CMake consumer
consumer() { # name prefix extra-cmake-args...
  local name=$1 prefix=$2
  shift 2
  local b="$WORK/consumer-$name"
  local fortran=OFF mpi=OFF
  { have "$MPIF90" || have "$FC"; } && fortran=ON
  [ "$FERROCCL_WITH_MPI" = 1 ] && mpi=ON
  check "cmake consumer ($name): configure (find_package(ferroccl CONFIG), Fortran=$fortran MPI=$mpi)" \
    "$CMAKE" -S "$SRCDIR/tests/packaging/consumer" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCONSUMER_FORTRAN=$fortran -DCONSUMER_MPI=$mpi "$@" || return 1
  check "cmake consumer ($name): build" "$CMAKE" --build "$b" -j "$(nproc)" || return 1
  check "consumer c_shared runs (ferroccl::ferroccl; RPATH, no LD_LIBRARY_PATH)" env -u LD_LIBRARY_PATH "$b/c_shared"
  [ -x "$b/c_static" ] && check "consumer c_static runs (ferroccl::ferroccl_static, no libnccl.so)" \
    bash -c "! ldd '$b/c_static' | grep -q libnccl && '$b/c_static'"
  check "consumer c_invalid_args runs" env FERROCCL_EXPECT_TLS="$FERROCCL_WITH_TLS" "$b/c_invalid_args"
  [ "$fortran" = ON ] && check "consumer f_version runs (ferroccl::fortran)" "$b/f_version"
  if [ "$mpi" = ON ]; then
    check "consumer c_mpi: mpirun -np 2" mpi_run 2 "$b/c_mpi"
    if [ "$fortran" = ON ]; then
      check "consumer f_mpi (use mpi): mpirun -np 2" mpi_run 2 "$b/f_mpi"
      check "consumer f_mpi_f08 (use mpi_f08): mpirun -np 2" mpi_run 2 "$b/f_mpi_f08"
    fi
  fi
  return 0
}
if have "$CMAKE"; then
  consumer install "$P"
  # Relocatable: the package must work from a copied prefix.
  cp -a "$P" "$WORK/moved-prefix"
  consumer relocated "$WORK/moved-prefix" -DCONSUMER_STATIC=OFF
  cat >"$WORK/ver.cmake" <<'X'
# ferrocclConfigVersion.cmake: 0.<minor> must match, later minors/majors are rejected.
set(CMAKE_SIZEOF_VOID_P 8)
include("${VERFILE}")
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${PACKAGE_VERSION}")
set(maj ${CMAKE_MATCH_1})
set(min ${CMAKE_MATCH_2})
macro(try v want)
  unset(PACKAGE_VERSION_COMPATIBLE)
  set(PACKAGE_FIND_VERSION ${v})
  string(REPLACE "." ";" _parts "${v}")
  list(GET _parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET _parts 1 PACKAGE_FIND_VERSION_MINOR)
  include("${VERFILE}")
  if(NOT "${PACKAGE_VERSION_COMPATIBLE}" STREQUAL "${want}")
    message(FATAL_ERROR "find_package(ferroccl ${v}) against ${PACKAGE_VERSION}: compatible=${PACKAGE_VERSION_COMPATIBLE}, want ${want}")
  endif()
endmacro()
try("${maj}.${min}" TRUE)
try("${PACKAGE_VERSION}" TRUE)
math(EXPR next "${min} + 1")
try("${maj}.${next}" FALSE)
math(EXPR nmaj "${maj} + 1")
try("${nmaj}.0" FALSE)
message(STATUS "version checks ok for ${PACKAGE_VERSION}")
X
  check "ferrocclConfigVersion.cmake accepts ${FERROCCL_VERSION%.*}, rejects the next minor and major" \
    "$CMAKE" -DVERFILE="$P/lib/cmake/ferroccl/ferrocclConfigVersion.cmake" -P "$WORK/ver.cmake"
else
  skip "cmake consumer" "$CMAKE not found"
fi

# ---- DESTDIR
check "make install DESTDIR=<tmp> PREFIX=/opt/ferroccl" \
  "$MAKE" "${MAKEARGS[@]}" install DESTDIR="$WORK/dest" PREFIX=/opt/ferroccl &&
  check "DESTDIR tree under <tmp>/opt/ferroccl, pkg-config prefix=/opt/ferroccl" \
    bash -c "[ -f '$WORK/dest/opt/ferroccl/lib/libferroccl.so' ] && grep -qx 'prefix=/opt/ferroccl' '$WORK/dest/opt/ferroccl/lib/pkgconfig/ferroccl.pc'"

summary
