#!/usr/bin/env bash
# ferroccl's whole test suite (the README's test command; .ci/run calls it):
#   cargo fmt --check; cargo clippy -D warnings (default features, openssl3, openssl3+mpi+ib);
#   make check-header; the layer check (tests/it/layers.rs: no cycle between top-level modules);
#   cargo test --profile quick --features openssl3,mpi(,ib when pkg-config finds libibverbs); the
#   benchmark's tests (cargo test --profile quick -p ferroccl-bench --features tls: the encryption
#   canary end to end) (quick: release optimisation without LTO, Cargo.toml; the packaging and
#   MPI steps use the library as `make` builds and installs it, with LTO);
#   make test-packaging; make test-mpi.
# Every step runs even when an earlier one failed; a summary table comes last, and the exit
# status is non-zero when any step failed.
#   FERROCCL_STEPS="fmt clippy ..." runs a subset (names as in the summary).
#   TLS_BACKEND / MPI select the build that test-packaging and test-mpi use (default: none/auto).
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
MAKE=${MAKE:-make}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}

# The IB transport's verbs edge (feature ib) is built, linted and tested where libibverbs is
# installed, as `make` builds it (IB=auto); its pure logic is tested in every build.
IB_FEATURE=""
if pkg-config --exists libibverbs 2>/dev/null && command -v cmake >/dev/null; then IB_FEATURE=",ib"; fi

steps=${FERROCCL_STEPS:-fmt clippy clippy-openssl3 clippy-all check-header layers cargo-test bench-test test-packaging test-mpi}
names=()
results=()
times=()

run_step() { # name cmd...
  local name=$1 start rc
  shift
  case " $steps " in *" $name "*) ;; *) return 0 ;; esac
  echo
  echo "==== $name: $*"
  start=$SECONDS
  "$@"
  rc=$?
  names+=("$name")
  times+=($((SECONDS - start)))
  if [ $rc -eq 0 ]; then results+=("PASS"); else results+=("FAIL (exit $rc)"); fi
  echo "==== $name: ${results[-1]} ($((SECONDS - start)) s)"
}

run_step fmt             "$CARGO" fmt --all -- --check --color never
run_step clippy          "$CARGO" clippy --workspace --all-targets -- -D warnings
run_step clippy-openssl3 "$CARGO" clippy --all-targets --features openssl3 -- -D warnings
run_step clippy-all      "$CARGO" clippy --workspace --all-targets --features openssl3,mpi$IB_FEATURE,ferroccl-bench/tls -- -D warnings
run_step check-header    "$MAKE" --no-print-directory check-header
run_step layers          "$CARGO" test --profile quick --features openssl3,mpi$IB_FEATURE --test it layers::
run_step cargo-test      "$CARGO" test --profile quick --features openssl3,mpi$IB_FEATURE
run_step bench-test      "$CARGO" test --profile quick -p ferroccl-bench --features tls
run_step test-packaging  "$MAKE" --no-print-directory test-packaging
run_step test-mpi        "$MAKE" --no-print-directory test-mpi

echo
echo "==== summary"
failed=0
for i in "${!names[@]}"; do
  printf '  %-16s %-16s %4d s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
  [ "${results[$i]}" = PASS ] || failed=$((failed + 1))
done
echo "$(( ${#names[@]} - failed )) passed, $failed failed"
[ $failed -eq 0 ]
