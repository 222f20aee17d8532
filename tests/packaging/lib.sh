# Shared helpers for tests/packaging/*.sh (sourced, not run).
#
# Environment (all optional; `make test-*` passes them):
#   FERROCCL_SRCDIR    repository root (default: two levels above this file)
#   FERROCCL_BUILDDIR  staging dir of the build under test (default: $FERROCCL_SRCDIR/build)
#   CARGO_TARGET_DIR   cargo target dir (default: $FERROCCL_SRCDIR/target)
#   MAKE, CC, CXX, MPICC, MPIF90, MPIRUN, FC (gfortran), CMAKE, PKG_CONFIG
#   FERROCCL_KEEP_TMP=1  keep the scratch directory
#   FERROCCL_TEST_VERBOSE=1  show the output of passing checks too
set -uo pipefail

SRCDIR=$(cd "${FERROCCL_SRCDIR:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
BUILDDIR=${FERROCCL_BUILDDIR:-$SRCDIR/build}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$SRCDIR/target}
MAKE=${MAKE:-make}
CC=${CC:-cc}
CXX=${CXX:-c++}
FC=${FC:-gfortran}
MPICC=${MPICC:-mpicc}
MPIF90=${MPIF90:-mpif90}
MPIRUN=${MPIRUN:-mpirun}
CMAKE=${CMAKE:-cmake}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
MPI_TIMEOUT=${MPI_TIMEOUT:-60}

# mpirun as root (containers, CI) and more ranks than cores.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
# Test traffic stays on loopback unless the caller chose an interface (as .cargo/config.toml
# does for cargo's tests).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}

PASSED=0
FAILED=0
FAILED_CHECKS=()
SCRIPT_NAME=$(basename "$0" .sh)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ferroccl-$SCRIPT_NAME.XXXXXX")
if [ "${FERROCCL_KEEP_TMP:-0}" != 1 ]; then
  trap 'rm -rf "$WORK"' EXIT
else
  echo "scratch directory: $WORK"
fi

pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); FAILED_CHECKS+=("$*"); echo "FAIL $*"; }
info() { echo "INFO $*"; }

# check NAME CMD...: CMD must succeed. Its output is shown (tail) when it fails.
check() {
  local name=$1 log rc
  shift
  log=$(mktemp "$WORK/log.XXXXXX")
  if "$@" >"$log" 2>&1; then
    pass "$name"
    [ "${FERROCCL_TEST_VERBOSE:-0}" = 1 ] && sed 's/^/    /' "$log"
    rc=0
  else
    rc=$?
    fail "$name (exit $rc)"
    sed 's/^/    /' "$log" | tail -n "${FERROCCL_TEST_LOG_LINES:-40}"
  fi
  rm -f "$log"
  return $rc
}

# check_fails NAME PATTERN CMD...: CMD must fail and its output must contain PATTERN (grep -E).
check_fails() {
  local name=$1 pattern=$2 log rc
  shift 2
  log=$(mktemp "$WORK/log.XXXXXX")
  "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    fail "$name (succeeded, expected a failure)"
    sed 's/^/    /' "$log" | tail -n 20
    rm -f "$log"
    return 1
  fi
  if grep -Eq -- "$pattern" "$log"; then
    pass "$name (exit $rc)"
    rm -f "$log"
    return 0
  fi
  fail "$name (exit $rc, output lacks /$pattern/)"
  sed 's/^/    /' "$log" | tail -n 20
  rm -f "$log"
  return 1
}

# skip NAME REASON: a check that cannot run here (counted neither way).
skip() { echo "SKIP $1: $2"; }

have() { command -v "$1" >/dev/null 2>&1; }

# Reads $1/ferroccl-build.env (written by make/cmake) into FERROCCL_* variables.
load_build_env() {
  local dir=$1
  if [ ! -f "$dir/ferroccl-build.env" ] || [ ! -f "$dir/lib/libferroccl.so" ]; then
    echo "error: no staged build in $dir (run 'make' first)" >&2
    return 1
  fi
  # shellcheck disable=SC1091
  . "$dir/ferroccl-build.env"
}

# Runs "$@" under mpirun with a timeout.
mpi_run() {
  local np=$1
  shift
  timeout "$MPI_TIMEOUT" "$MPIRUN" -np "$np" --oversubscribe "$@"
}

# Prints the failed checks, then the final "N passed, M failed" line; returns non-zero on failure.
summary() {
  if [ "$FAILED" -ne 0 ]; then
    echo "$SCRIPT_NAME: failed checks:"
    printf '  %s\n' "${FAILED_CHECKS[@]}"
  fi
  # Machine-readable line for run-all.sh.
  if [ -n "${FERROCCL_RESULTS_FILE:-}" ]; then
    echo "$SCRIPT_NAME $PASSED $FAILED" >>"$FERROCCL_RESULTS_FILE"
  fi
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}

# Functions declared by a header (extern declarations; not macros or static inline helpers).
header_functions() {
  grep -vE '^[[:space:]]*(#|static|/\*|\*|//)' "$1" |
    grep -oE '(^|[[:space:]*])(p?nccl|ferroccl)[A-Za-z0-9_]*[[:space:]]*\(' |
    sed -E 's/^[[:space:]*]*//; s/[[:space:]]*\($//' | sort -u
}

# Dynamic symbols defined (exported) by a shared library.
exported_symbols() {
  nm -D --defined-only "$1" | awk '{print $NF}' | sed 's/@.*//' | sort -u
}

# Every function-like declaration of a header (any name), for spotting leaked foreign ones.
header_all_declarations() {
  grep -vE '^[[:space:]]*(#|static|typedef|/\*|\*|//)' "$1" |
    grep -E '^[A-Za-z_].*[[:space:]*]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\(.*\);' |
    sed -E 's/^([^(]*[[:space:]*])([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\(.*/\2/' | sort -u
}
