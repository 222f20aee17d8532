#!/usr/bin/env bash
# Installs the Debian 12 packages ferroccl builds and tests with (idempotent: nothing is
# installed when all are present). Used by .ci/run and scripts/demo.sh.
set -euo pipefail
# The IB transport (cargo feature ib, on when pkg-config finds libibverbs): libibverbs-dev, and
# for ibverbs-sys's build script cmake, libnl dev files and libclang (bindgen needs only
# libclang1-14 + libclang-common-14-dev, listed for mpi already).
packages=(libopenmpi-dev openmpi-bin gfortran cmake pkg-config libssl-dev libclang1-14
          libclang-common-14-dev libhwloc-dev tcpdump libibverbs-dev libnl-3-dev libnl-route-3-dev)
missing=()
for p in "${packages[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "build dependencies present: ${packages[*]}"
  exit 0
fi
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
$sudo apt-get update
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
