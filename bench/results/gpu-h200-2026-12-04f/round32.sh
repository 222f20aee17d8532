#!/usr/bin/env bash
# Round 32: is staged (pinned) host memory slower for the CPU and for loopback TCP than malloc'd?
set -u
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag 2>&1
nvcc -O2 bench/gpu/pinned_host.cu -o /tmp/pinned_host && for m in 4 64; do /tmp/pinned_host $m; done
