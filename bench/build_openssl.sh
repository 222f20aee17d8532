#!/usr/bin/env bash
# Builds a newer OpenSSL 3 (static libcrypto.a/libssl.a + headers) for measuring ferroccl's TLS
# with an AES-GCM that has the VAES/AVX-512 code path Debian 12's OpenSSL 3.0 lacks, as in
# bench/results/tls-canary-2026-12-02.md. The sources come from crates.io's openssl-src crate
# (the registry is reachable where nothing else is); nothing of it enters this repository.
#
#   bench/build_openssl.sh [PREFIX]        (default /opt/openssl-3)
#   OPENSSL_DIR=PREFIX OPENSSL_STATIC=1 cargo build --release -p ferroccl-bench --features tls
#   OPENSSL_DIR=PREFIX OPENSSL_STATIC=1 make TLS_BACKEND=OPENSSL3     (libnccl.so with it inside)
#
# OPENSSL_SRC_VERSION picks the crate version (default 300: the newest 3.x it packages).
set -euo pipefail
prefix=${1:-/opt/openssl-3}
version=${OPENSSL_SRC_VERSION:-300}
work=$(mktemp -d /tmp/ferroccl-openssl.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Let cargo fetch the crate into its registry cache, then find its source tree.
mkdir -p "$work/fetch/src"
printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nopenssl-src = "%s"\n' \
  "$version" >"$work/fetch/Cargo.toml"
echo 'fn main() {}' >"$work/fetch/src/main.rs"
(cd "$work/fetch" && cargo fetch -q)
src=$(cd "$work/fetch" && cargo metadata --format-version 1 |
  python3 -c 'import json,sys; m=json.load(sys.stdin); print(next(p["manifest_path"] for p in m["packages"] if p["name"]=="openssl-src"))')
src=$(dirname "$src")/openssl
echo "# building $(basename "$(dirname "$src")") into $prefix"

# The crate ships what the static libraries need but not the shared-library version scripts,
# so only the .a targets are built; `shared` makes their objects position-independent, which
# linking them into libnccl.so needs.
cp -r "$src" "$work/openssl"
cd "$work/openssl"
./Configure shared no-module no-legacy no-tests no-docs no-comp no-zlib --prefix="$prefix" --libdir=lib >/dev/null
make -s -j"$(nproc)" build_generated >/dev/null
make -s -j"$(nproc)" libcrypto.a libssl.a >/dev/null
mkdir -p "$prefix/lib" "$prefix/include"
cp libcrypto.a libssl.a "$prefix/lib/"
cp -r include/openssl "$prefix/include/"
echo "# done: $prefix/lib/libcrypto.a, $prefix/lib/libssl.a, $prefix/include/openssl"
