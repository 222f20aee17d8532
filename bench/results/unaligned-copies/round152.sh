#!/usr/bin/env bash
# Round 152 (device machine's 16-core Intel host, 2026-12-07): array sections (buffers 4 bytes
# past their arrays' alignment, --unalign 1) in arrays of their own size, against Open MPI, at
# 2, 8 and 16 ranks, after src/memcopy.rs (995a46a). glibc on Intel steps around the short
# distance rep movsb penalty itself, so the probe should keep memcpy here: this checks that the
# AMD VM's fix costs nothing on this host, and records the cells on it.
#   bench/compare_ompi.sh -np 2,8,16 --sizes 1K:4M --factor 4 --arrays --unalign 1 --repeat 2 --tier 1M:20:5
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ cat .dev/build.commit; nproc; grep -m1 'model name' /proc/cpuinfo; uptime; date -u; ldd --version | head -1; } 2>&1 | tee $R/host.txt
timeout 520 bench/compare_ompi.sh -np 2,8,16 --sizes 1K:4M --factor 4 --arrays --unalign 1 --repeat 2 --tier 1M:20:5 \
  --timeout 150 --keep-logs --no-build --ferroccl-bench $PWD/.dev/fb --out $R/u1 > $R/compare.log 2>&1
echo "compare rc=$? after $(( $(date +%s) - T0 ))s"
tail -5 $R/compare.log
sed -n '/## Targets/,/## Small/p' $R/u1.md | head -60
cd $OUT && tar czf r.tgz r && rm -rf r
