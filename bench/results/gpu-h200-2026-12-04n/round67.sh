#!/usr/bin/env bash
# Round 67 (one H200): round 66 again with copies under 1 MiB as a kernel, and the copier's queue split into its phases;: an 8-byte device sendrecv
# timed from inside with NCCL_DEBUG=TRACE (P2P): the host exchange (buffer exports and the two
# host messages) and the queuing of flags and copies, per call, median over 2,000 calls.
set -u
PFX=$PWD/.dev/prefix; SRC=$PWD/.dev/nccl-tests; BUILD=/tmp/b; R=$OUT/r
mkdir -p $R $BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 FERROCCL_TIMEOUT=30
MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi; GEN="-gencode=arch=compute_90,code=sm_90"
make -C $SRC -j15 MPI=1 MPI_HOME=$MPI_HOME NCCL_HOME=$PFX NVCC_GENCODE="$GEN" BUILDDIR=$BUILD/f >$BUILD/f.log 2>&1; echo "nccl-tests build rc=$?"
F=$BUILD/f
timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib $F/sendrecv_perf -b 8 -e 8 -n 2000 -w 100 > $R/plain.log 2>&1
echo "plain rc=$? $(grep -E '^ +8 ' $R/plain.log)"
timeout 100 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib -x NCCL_DEBUG=TRACE -x NCCL_DEBUG_SUBSYS=P2P -x NCCL_DEBUG_FILE=$R/trace.%h.%p $F/sendrecv_perf -b 8 -e 8 -n 2000 -w 100 > $R/traced.log 2>&1
echo "traced rc=$? $(grep -E '^ +8 ' $R/traced.log)"
for f in $R/trace.*; do
  echo "== $f"
  grep -oE "host messages [0-9]+ us" $f | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {print "host messages us: median", a[int(NR/2)], "p90", a[int(NR*0.9)], "n", NR}'
  grep -oE "exchange [0-9]+ us, queue [0-9]+ us" $f | awk '{print $2, $5}' | sort -n | awk '{x[NR]=$1; q[NR]=$2} END {print "exchange us: median", x[int(NR/2)], "n", NR}'
  grep -oE "queue [0-9]+ us" $f | awk '{print $2}' | sort -n | awk '{a[NR]=$1} END {print "queue us: median", a[int(NR/2)], "p90", a[int(NR*0.9)]}'
  grep -oE "waits queued [0-9]+ us, copies [0-9]+ us, writes [0-9]+ us" $f | awk '{print $3, $6, $9}' | sort -n -k2 | awk '{w[NR]=$1; c[NR]=$2; x[NR]=$3} END {if (NR) print "copier phases (median by copies): waits", w[int(NR/2)], "copies", c[int(NR/2)], "writes", x[int(NR/2)], "n", NR}'
done
timeout 60 mpirun -np 2 --bind-to none -x NCCL_TESTS_DEVICE=0 -x LD_LIBRARY_PATH=$PFX/lib $F/sendrecv_perf -b 8 -e 64M -f 4 -n 20 -w 5 > $R/sweep.log 2>&1
echo "sweep rc=$? $(grep -E 'Out of bounds' $R/sweep.log | awk '{print $(NF-1), $NF}') $(awk '$1 ~ /^[0-9]+$/ && NF > 10 {printf "%s:%s/%s ", $1, $6, $9}' $R/sweep.log)"
cd $OUT && tar czf r.tgz r && rm -rf r
