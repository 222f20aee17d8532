#!/usr/bin/env bash
# Issue 4 §7(a): the marker in ferroccl's buffers never crosses the wire in the clear once a
# pre-shared key is set, while the same run without a key shows it.
#
# Runs examples/tls_marker (ranks as threads: all-gather + broadcast of buffers filled with
# an ASCII marker) over loopback twice, plaintext then encrypted, each under
# `tcpdump -i lo -w`, and searches the captures. The marker gets a random suffix so that other
# loopback traffic on the machine cannot match it.
#
# Usage: tests/tls/capture.sh [path/to/tls_marker]   (default: builds it with
#        --features openssl3 into $CARGO_TARGET_DIR, else target/). Needs tcpdump and the
#        right to capture on lo (root or CAP_NET_RAW). Exit 0 all passed, 1 a check failed,
#        77 skipped (no tcpdump / no permission).
set -u
export NCCL_SOCKET_IFNAME=lo
# Ranks are threads of one process: keep their data on sockets (shared memory is outside
# the TLS boundary and would bypass the wire).
export NCCL_SHM_DISABLE=1
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-}
if [ -z "$bin" ]; then
    (cd "$here" && cargo build -q --features openssl3 --example tls_marker) || { echo "build failed"; exit 1; }
    bin=${CARGO_TARGET_DIR:-$here/target}/debug/examples/tls_marker
fi
if ! command -v tcpdump >/dev/null 2>&1; then
    echo "SKIP: tcpdump is not installed (apt-get install tcpdump)"
    exit 77
fi

dir=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT; [ -n "${KEEP:-}" ] && echo "captures in $dir"
marker="FERROCCL-MARKER-7f3a-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
psk="capture-test-psk-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
bytes=$((256 * 1024))
passed=0
failed=0

check() { # check <description> <command...>
    local what=$1
    shift
    if "$@"; then
        echo "PASS: $what"
        passed=$((passed + 1))
    else
        echo "FAIL: $what"
        failed=$((failed + 1))
    fi
}

# capture <name> <args...>: runs tls_marker under tcpdump; leaves $dir/<name>.{pcap,out}.
capture() {
    local name=$1
    shift
    tcpdump -i lo --immediate-mode -U -s 0 -w "$dir/$name.pcap" tcp >"$dir/$name.tcpdump" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do
        grep -q "listening on" "$dir/$name.tcpdump" 2>/dev/null && break
        if ! kill -0 $pid 2>/dev/null; then break; fi
        sleep 0.05
    done
    if ! kill -0 $pid 2>/dev/null; then
        echo "SKIP: tcpdump cannot capture on lo: $(cat "$dir/$name.tcpdump")"
        exit 77
    fi
    timeout 60 "$bin" --marker "$marker" --bytes $bytes "$@" >"$dir/$name.out" 2>&1
    echo $? >"$dir/$name.rc"
    sleep 1 # let tcpdump write out what the kernel handed it
    kill -INT $pid
    wait $pid 2>/dev/null
}

has() { LC_ALL=C grep -q -a -F -- "$2" "$1"; }
lacks() { ! has "$@"; }
succeeded() { [ "$(cat "$dir/$1.rc")" = 0 ] || { cat "$dir/$1.out"; false; }; }
bigger_than() { [ "$(stat -c %s "$1")" -gt "$2" ]; }
# A TLS 1.3 application-data record header (type 23, legacy version 3.3).
tls_records() { LC_ALL=C grep -q -a -P '\x17\x03\x03' "$1"; }

capture plain
capture tls --psk "$psk"
# The same, with each data connection striped over two TLS sockets and helper threads.
NCCL_SOCKET_NTHREADS=2 capture striped --psk "$psk"

check "plaintext run completes" succeeded plain
check "plaintext capture shows the marker" has "$dir/plain.pcap" "$marker"
check "encrypted run completes" succeeded tls
check "encrypted capture holds the traffic (> $((bytes * 2)) bytes)" bigger_than "$dir/tls.pcap" $((bytes * 2))
check "encrypted capture has TLS records" tls_records "$dir/tls.pcap"
check "encrypted capture never shows the marker" lacks "$dir/tls.pcap" "$marker"
check "encrypted capture never shows the pre-shared key" lacks "$dir/tls.pcap" "$psk"
check "striped encrypted run completes" succeeded striped
check "striped encrypted capture has TLS records" tls_records "$dir/striped.pcap"
check "striped encrypted capture never shows the marker" lacks "$dir/striped.pcap" "$marker"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
