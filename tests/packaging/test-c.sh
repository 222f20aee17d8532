#!/usr/bin/env bash
# C/C++ checks of the staged build ($FERROCCL_BUILDDIR, default build/): header ABI (C99, C11,
# C++11, with and without CUDA headers first, after mpi.h), SONAME and exported symbols,
# invalid-argument behaviour, and link tests against build/lib (shared and static).
# One line per check, then "N passed, M failed"; exits non-zero on failure.
source "$(dirname "$0")/lib.sh"

load_build_env "$BUILDDIR" || exit 1
INC=$BUILDDIR/include
LIB=$BUILDDIR/lib
T=$SRCDIR/tests/c
STRICT="-Wall -Wextra -pedantic -Werror"
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "== test-c: $BUILDDIR (ferroccl $FERROCCL_VERSION, features: ${FERROCCL_FEATURES:-none}, by $FERROCCL_BUILT_BY)"

# ---- library file checks
check "SONAME of libferroccl.so is libnccl.so.2" \
  bash -c "readelf -d '$LIB/libferroccl.so' | grep -E 'SONAME.*\[libnccl\.so\.2\]'"
check "staged links: libnccl.so -> libnccl.so.2 -> libferroccl.so, libnccl.a -> libferroccl.a" \
  bash -c "[ \"\$(readlink '$LIB/libnccl.so')\" = libnccl.so.2 ] && [ \"\$(readlink '$LIB/libnccl.so.2')\" = libferroccl.so ] && [ \"\$(readlink '$LIB/libnccl.a')\" = libferroccl.a ]"
check "staged nccl.h is include/nccl.h" cmp "$SRCDIR/include/nccl.h" "$INC/nccl.h"

if [ "$FERROCCL_WITH_TLS" = 1 ]; then
  check "ldd: TLS build links libssl.so.3" bash -c "ldd '$LIB/libferroccl.so' | grep -q 'libssl\.so\.3'"
else
  check "ldd: no-TLS build has no libssl/libcrypto" bash -c "! ldd '$LIB/libferroccl.so' | grep -Eq 'libssl|libcrypto'"
fi
if [ "$FERROCCL_WITH_MPI" = 1 ]; then
  check "ldd: MPI build links libmpi" bash -c "ldd '$LIB/libferroccl.so' | grep -q 'libmpi\.so'"
else
  check "ldd: no-MPI build has no libmpi" bash -c "! ldd '$LIB/libferroccl.so' | grep -q 'libmpi'"
fi
if [ "${FERROCCL_WITH_IB:-0}" = 1 ]; then
  check "ldd: IB build links libibverbs" bash -c "ldd '$LIB/libferroccl.so' | grep -q 'libibverbs\.so'"
  check "static libs of the IB build include -libverbs" grep -qw -- -libverbs "$BUILDDIR/native-static-libs.txt"
else
  check "ldd: no-IB build has no libibverbs" bash -c "! ldd '$LIB/libferroccl.so' | grep -q 'libibverbs'"
fi
check "ldd: no unresolved libraries" bash -c "! ldd '$LIB/libferroccl.so' | grep -q 'not found'"

header_functions "$INC/nccl.h" >"$WORK/header-functions"
exported_symbols "$LIB/libferroccl.so" >"$WORK/exported"
check "every function declared in nccl.h is exported ($(wc -l <"$WORK/header-functions") functions)" \
  bash -c "missing=\$(comm -23 '$WORK/header-functions' '$WORK/exported'); [ -z \"\$missing\" ] || { echo \"not exported: \$missing\"; exit 1; }"
header_all_declarations "$INC/nccl.h" >"$WORK/header-declarations"
check "nccl.h declares only nccl*/ferroccl* functions (no leaked extern blocks)" \
  bash -c "other=\$(grep -vE '^(p?nccl|ferroccl)' '$WORK/header-declarations'); [ -z \"\$other\" ] || { echo \"foreign declarations: \$other\"; exit 1; }"
check "only nccl*/pnccl*/ferroccl* symbols are exported" \
  bash -c "other=\$(grep -vE '^(p?nccl|ferroccl)' '$WORK/exported' | grep -vE '^(_init|_fini|__bss_start|_edata|_end)\$'); [ -z \"\$other\" ] || { echo \"unexpected exports:\"; echo \"\$other\" | head -n 30; exit 1; }"
n_nccl=$(grep -c '^nccl' "$WORK/exported" || true)
n_pnccl=$(grep -c '^pnccl' "$WORK/exported" || true)
check "every nccl* export has its pnccl* profiling alias ($n_pnccl for $n_nccl)" \
  bash -c "missing=\$(comm -23 <(grep '^nccl' '$WORK/exported' | sort) <(grep '^pnccl' '$WORK/exported' | sed 's/^p//' | sort)); [ -z \"\$missing\" ] || { echo \"no alias: \$missing\"; exit 1; }"
check "ferroccl version in nccl.h matches Cargo.toml ($FERROCCL_VERSION)" \
  bash -c "grep -q '^#define FERROCCL_VERSION_STRING \"$FERROCCL_VERSION\"' '$INC/nccl.h'"

# ---- header ABI: C99, C11, C++11 (+ fake CUDA headers first)
abi() { # name compiler std extra...
  local name=$1 cc=$2 std=$3
  shift 3
  local exe="$WORK/abi-$name"
  check "abi_static_asserts: $name compiles ($std $STRICT $*)" \
    $cc -std="$std" $STRICT "$@" -I"$INC" -I"$T" -o "$exe" "$( [ "$cc" = "$CXX" ] && echo "$T/abi_static_asserts.cpp" || echo "$T/abi_static_asserts.c")" -L"$LIB" -lnccl &&
    check "abi_static_asserts: $name runs" "$exe"
}
abi c99 "$CC" c99
abi c11 "$CC" c11
abi c99-fakecuda "$CC" c99 -DWITH_FAKE_CUDA -I"$T/fakecuda"
abi c11-fakecuda "$CC" c11 -DWITH_FAKE_CUDA -I"$T/fakecuda"
abi c++11 "$CXX" c++11
abi c++11-fakecuda "$CXX" c++11 -DWITH_FAKE_CUDA -I"$T/fakecuda"
abi c++17 "$CXX" c++17
check "nccl.h includes CUDA's headers when they are on the include path (C99 and C++11; half, bf16, fp8 known)" bash -c "
  '$CC' -std=c99 $STRICT -I'$INC' -I'$T/fakecuda' -o '$WORK/cuda_includes' '$T/cuda_includes.c' -L'$LIB' -lnccl &&
  '$WORK/cuda_includes' &&
  '$CXX' -std=c++11 $STRICT -I'$INC' -I'$T/fakecuda' -x c++ -fsyntax-only '$T/cuda_includes.c'"
check "without CUDA's headers on the path the same program does not compile (the check above can fail)" bash -c "
  ! '$CC' -std=c99 $STRICT -I'$INC' -fsyntax-only '$T/cuda_includes.c' 2>/dev/null"
CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
if [ -f "$CUDA_INC/cuda_runtime.h" ]; then
  # The real toolkit's headers are not -pedantic clean in C; C++ uses half, bf16 and fp8.
  check "nccl.h with the CUDA toolkit's own headers ($CUDA_INC): C99 links and runs, C++11 knows half/bf16/fp8" bash -c "
    printf '#include \"nccl.h\"\nint main(void){cudaStream_t s=0;int v=0;(void)s;return !(ncclGetVersion(&v)==ncclSuccess&&v==NCCL_VERSION_CODE&&CUDART_VERSION>0);}\n' >'$WORK/real_cuda.c' &&
    '$CC' -std=c99 -I'$INC' -I'$CUDA_INC' -o '$WORK/real_cuda' '$WORK/real_cuda.c' -L'$LIB' -lnccl && '$WORK/real_cuda' &&
    '$CXX' -std=c++11 -I'$INC' -I'$CUDA_INC' -o '$WORK/real_cuda_cxx' '$T/real_cuda_types.cpp' -L'$LIB' -lnccl && '$WORK/real_cuda_cxx'"
else
  echo "skipped: nccl.h with the CUDA toolkit's own headers (no $CUDA_INC/cuda_runtime.h here; runs on the GPU machine)"
fi
check "FERROCCL_NO_CUDA_HEADERS keeps CUDA's headers out" bash -c "
  ! '$CC' -std=c99 $STRICT -DFERROCCL_NO_CUDA_HEADERS -I'$INC' -I'$T/fakecuda' -fsyntax-only '$T/cuda_includes.c' 2>/dev/null"
check "nccl.h included twice (include guard), C11" \
  "$CC" -std=c11 $STRICT -I"$INC" -include nccl.h -fsyntax-only "$T/abi_static_asserts.c"
check "nccl.h alone is self-contained (C99 and C++11, -fsyntax-only)" bash -c "
  echo '#include \"nccl.h\"' | '$CC' -std=c99 $STRICT -I'$INC' -x c -fsyntax-only - &&
  echo '#include \"nccl.h\"' | '$CXX' -std=c++11 $STRICT -I'$INC' -x c++ -fsyntax-only -"
if have "$MPICC"; then
  check "nccl.h after mpi.h: ferrocclCommInitMpiComm wrappers compile (C99 and C++11)" bash -c "
    '$MPICC' -std=c99 -Wall -Wextra -Werror -I'$INC' -c '$T/mpi_header.c' -o '$WORK/mpi_header.o' &&
    '$MPICC' -x c++ -std=c++11 -Wall -Wextra -Werror -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX -I'$INC' -c '$T/mpi_header.c' -o '$WORK/mpi_header_cxx.o'"
else
  skip "nccl.h after mpi.h" "$MPICC not found"
fi

# ---- invalid arguments
if check "invalid_args compiles (c99 $STRICT)" \
    "$CC" -std=c99 $STRICT -I"$INC" -o "$WORK/invalid_args" "$T/invalid_args.c" -L"$LIB" -lnccl; then
  FERROCCL_EXPECT_TLS=$FERROCCL_WITH_TLS "$WORK/invalid_args" >"$WORK/invalid_args.out" 2>&1
  rc=$?
  line=$(tail -n 1 "$WORK/invalid_args.out")
  if [ $rc -eq 0 ]; then
    pass "invalid_args: $line"
    [ "${FERROCCL_TEST_VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$WORK/invalid_args.out"
  else
    fail "invalid_args: ${line:-no output} (exit $rc)"
    grep -v '^PASS' "$WORK/invalid_args.out" | sed 's/^/    /' | tail -n 60
  fi
fi

# ---- link tests against the staged tree
check "link (shared): cc version.c -I build/include -L build/lib -lnccl" \
  "$CC" -std=c99 $STRICT -I"$INC" -o "$WORK/version-shared" "$T/version.c" -L"$LIB" -lnccl
check "version-shared: DT_NEEDED is libnccl.so.2" \
  bash -c "readelf -d '$WORK/version-shared' | grep -E 'NEEDED.*\[libnccl\.so\.2\]'"
check "version-shared runs (LD_LIBRARY_PATH=build/lib)" "$WORK/version-shared"
check "link (static): cc version.c build/lib/libnccl.a $FERROCCL_NATIVE_STATIC_LIBS" \
  "$CC" -std=c99 $STRICT -I"$INC" -o "$WORK/version-static" "$T/version.c" "$LIB/libnccl.a" \
  $( [ "$FERROCCL_WITH_MPI" = 1 ] && "$MPICC" -showme:link 2>/dev/null | tr ' ' '\n' | grep '^-L' ) $FERROCCL_NATIVE_STATIC_LIBS
check "version-static runs without libnccl.so" \
  bash -c "! ldd '$WORK/version-static' | grep -q libnccl && env -u LD_LIBRARY_PATH '$WORK/version-static'"
check "link (C++): c++ abi_static_asserts.cpp against libnccl.a" \
  "$CXX" -std=c++11 $STRICT -I"$INC" -I"$T" -o "$WORK/abi-cxx-static" "$T/abi_static_asserts.cpp" "$LIB/libnccl.a" \
  $( [ "$FERROCCL_WITH_MPI" = 1 ] && "$MPICC" -showme:link 2>/dev/null | tr ' ' '\n' | grep '^-L' ) $FERROCCL_NATIVE_STATIC_LIBS

summary
