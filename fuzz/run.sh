#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 60 s each) on the nightly toolchain,
# growing the corpus kept in fuzz/corpus/<target> (committed), and prints one line per target.
# A crash stops with the input saved under fuzz/artifacts/<target>/ and a non-zero exit.
#   cargo install cargo-fuzz; ./fuzz/run.sh [seconds per target] [target...]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
targets=${*:-$(cargo +nightly fuzz list)}
status=0
for t in $targets; do
  mkdir -p "corpus/$t"
  before=$(ls "corpus/$t" | wc -l)
  log=$(mktemp)
  if cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -max_len=4096 >"$log" 2>&1; then
    result=ok
  else
    result=CRASH; status=1
    tail -n 30 "$log"
  fi
  runs=$(grep -oE "Done [0-9]+ runs" "$log" | grep -oE "[0-9]+" || echo "?")
  cov=$(grep -oE "cov: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+" || echo "?")
  printf '%-16s %-6s %10s runs in %ss, coverage %s, corpus %s -> %s\n' "$t" "$result" "$runs" "$secs" "$cov" "$before" "$(ls "corpus/$t" | wc -l)"
  rm -f "$log"
done
exit $status
