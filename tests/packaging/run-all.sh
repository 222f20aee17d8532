#!/usr/bin/env bash
# Runs every packaging test script (used by `make test-packaging` and scripts/test-all.sh) and
# prints each script's result and the total "N passed, M failed"; exits non-zero on failure.
# Order keeps cargo feature flips to a minimum: the build under test first, the TLS/MPI
# matrix (other feature sets) last.
#   FERROCCL_PACKAGING_TESTS="test-c test-fortran ..." runs a subset.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tests=${FERROCCL_PACKAGING_TESTS:-test-c test-fortran test-install test-cmake test-tls-matrix}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
export FERROCCL_RESULTS_FILE=$results
status=0
for t in $tests; do
  start=$SECONDS
  if ! "$here/$t.sh"; then
    status=1
    grep -q "^$t " "$results" || echo "$t 0 1" >>"$results"   # crashed before its summary
  fi
  echo "   ($t: $((SECONDS - start)) s)"
  echo
done
echo "== packaging tests"
total_pass=0
total_fail=0
while read -r name p f; do
  printf '  %-18s %3d passed, %3d failed\n' "$name" "$p" "$f"
  total_pass=$((total_pass + p))
  total_fail=$((total_fail + f))
done <"$results"
echo "$total_pass passed, $total_fail failed"
[ $status -eq 0 ] && [ $total_fail -eq 0 ]
