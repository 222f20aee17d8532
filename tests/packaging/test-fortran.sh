#!/usr/bin/env bash
# Fortran checks: module compiles (with mpi_f08, and with -DFERROCCL_NO_MPI_F08 under plain
# gfortran), its constants and struct layouts equal nccl.h's, every bind(C) name is exported
# by the library and every nccl.h function has a binding, a non-MPI program runs, and (MPI
# builds) the `use mpi` and `use mpi_f08` programs run under mpirun -np 2.
# One line per check, then "N passed, M failed"; exits non-zero on failure.
source "$(dirname "$0")/lib.sh"

load_build_env "$BUILDDIR" || exit 1
INC=$BUILDDIR/include
LIB=$BUILDDIR/lib
SRC=$SRCDIR/fortran/ferroccl.F90
TF=$SRCDIR/tests/fortran
RPATH="-Wl,-rpath,$LIB"
echo "== test-fortran: $BUILDDIR (features: ${FERROCCL_FEATURES:-none})"

if [ "$FERROCCL_WITH_MPI" = 1 ] && have "$MPIF90"; then
  FCMOD=$MPIF90
  DEFS=""
elif have "$FC"; then
  FCMOD=$FC
  DEFS="-DFERROCCL_NO_MPI_F08"
else
  skip "all Fortran checks" "no Fortran compiler ($MPIF90 / $FC)"
  summary
  exit $?
fi

# ---- the module itself
mkdir -p "$WORK/mod" "$WORK/mod-nompi"
if have "$MPIF90"; then
  check "module compiles with $MPIF90 (mpi_f08 specific; -std=f2018 -Wall -Wextra -Werror)" \
    bash -c "mkdir -p '$WORK/mod-f08' && cd '$WORK/mod-f08' && '$MPIF90' -std=f2018 -Wall -Wextra -Werror -c '$SRC'"
else
  skip "module with mpi_f08" "$MPIF90 not found"
fi
if have "$FC"; then
  check "module compiles with $FC -DFERROCCL_NO_MPI_F08 (no MPI; -std=f2018 -Wall -Wextra -Werror)" \
    bash -c "cd '$WORK/mod-nompi' && '$FC' -std=f2018 -Wall -Wextra -Werror -DFERROCCL_NO_MPI_F08 -c '$SRC'"
fi
check "module for the tests ($FCMOD $DEFS)" \
  bash -c "cd '$WORK/mod' && '$FCMOD' -O1 $DEFS -c '$SRC' -o ferroccl.o"

# ---- constants and layouts vs nccl.h
if check "tests/c/constants.c compiles" "$CC" -std=c99 -Wall -I"$INC" -o "$WORK/constants_c" "$SRCDIR/tests/c/constants.c" &&
   check "tests/fortran/constants.F90 compiles" \
     "$FCMOD" -I"$WORK/mod" -o "$WORK/constants_f" "$TF/constants.F90" "$WORK/mod/ferroccl.o" -L"$LIB" -lnccl $RPATH; then
  "$WORK/constants_c" >"$WORK/constants_c.txt"
  "$WORK/constants_f" >"$WORK/constants_f.txt"
  check "Fortran constants, sizes, offsets and initializers equal nccl.h's ($(wc -l <"$WORK/constants_c.txt") lines)" \
    diff -u "$WORK/constants_c.txt" "$WORK/constants_f.txt"
fi

# ---- bindings vs the library and the header
grep -oiE "bind\(c, *name *= *'[A-Za-z0-9_]+'" "$SRC" | sed -E "s/.*'([A-Za-z0-9_]+)'/\1/" |
  grep -v '^strlen$' | sort -u >"$WORK/fortran-bindings"
exported_symbols "$LIB/libferroccl.so" >"$WORK/exported"
header_functions "$INC/nccl.h" | grep -v '^pnccl' >"$WORK/header-functions"
# Not bound on purpose (none yet); one name per line.
: >"$WORK/not-bound"
check "every bind(C) name in ferroccl.F90 is exported by libferroccl.so ($(wc -l <"$WORK/fortran-bindings") bindings)" \
  bash -c "m=\$(comm -23 '$WORK/fortran-bindings' '$WORK/exported'); [ -z \"\$m\" ] || { echo \"bound but not exported: \$m\"; exit 1; }"
check "every function of nccl.h has a Fortran binding" \
  bash -c "m=\$(comm -23 '$WORK/header-functions' '$WORK/fortran-bindings' | grep -vxFf '$WORK/not-bound'); [ -z \"\$m\" ] || { echo \"no Fortran binding: \$m\"; exit 1; }"

# ---- run: no MPI
check "tests/fortran/version.f90 compiles and links" \
  bash -c "cd '$WORK/mod' && '$FCMOD' -I'$WORK/mod' -o '$WORK/version_f' '$TF/version.f90' ferroccl.o -L'$LIB' -lnccl $RPATH" &&
  check "version_f runs (ncclGetVersion, error strings, 1-rank comm, allreduce)" "$WORK/version_f"

# ---- run: MPI (use mpi, use mpi_f08)
if [ "$FERROCCL_WITH_MPI" = 1 ] && have "$MPIF90" && have "$MPIRUN"; then
  for prog in comm_init_mpi comm_init_mpi_f08; do
    check "$prog.f90 compiles and links" \
      bash -c "cd '$WORK/mod' && '$MPIF90' -I'$WORK/mod' -o '$WORK/$prog' '$TF/$prog.f90' ferroccl.o -L'$LIB' -lnccl $RPATH" &&
      check "mpirun -np 2 $prog" mpi_run 2 "$WORK/$prog"
  done
  check "staged module archive: link comm_init_mpi against build/lib/libferroccl_fortran.a" \
    bash -c "[ -f '$LIB/libferroccl_fortran.a' ] && [ -f '$BUILDDIR/fortran/ferroccl.mod' ] && cd '$WORK' &&
             '$MPIF90' -I'$BUILDDIR/fortran' -o '$WORK/staged_f90' '$TF/comm_init_mpi.f90' -L'$LIB' -lferroccl_fortran -lnccl $RPATH"
else
  skip "MPI Fortran programs" "built without MPI or no $MPIF90/$MPIRUN"
fi

summary
