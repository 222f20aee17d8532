#!/bin/bash
# TLS throughput probe on the device host (experiment, not committed)
export NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo FERROCCL_PSK=0123456789abcdef0123456789abcdef0123
echo "# $(nproc) cores; ulp: $(cat /proc/sys/net/ipv4/tcp_available_ulp); $(openssl version); $(uname -r); $(date -u)"
which perf pidstat 2>&1 | head -2
run() { # label envs bin args
  t=$(env $2 timeout 60 $3 all_reduce -t 2 $4 -b 64M -e 64M -n 20 -w 3 -c 0 2>&1 | awk '/^ *67108864/{print $6, $10}')
  echo "$1 $t"
}
P="--psk-env FERROCCL_PSK"
for r in 1 2 3; do
  run old30-plain "" .devx/old-tls30 ""
  run old30-tls "" .devx/old-tls30 "$P"
 for b in x-tls30 x-tls36; do
  B=.devx/$b
  run $b-plain "" $B ""
  run $b-tls "" $B "$P"
  run $b-tls-wf512 "XWF=524288" $B "$P"
  run $b-tls-t8 "NCCL_SOCKET_NTHREADS=8" $B "$P"
  run $b-tls-t8-wf512 "NCCL_SOCKET_NTHREADS=8 XWF=524288" $B "$P"
  run $b-plain-t8 "NCCL_SOCKET_NTHREADS=8" $B ""
 done
done > $OUT/probe.txt
python3 - $OUT/probe.txt <<'PY'
import sys,collections,statistics
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
  p=l.split()
  if len(p)==3: d[p[0]]+=[float(p[1]),float(p[2])]
for k,v in d.items(): print(f"{k:22s} time median {statistics.median(v)/1000:.2f} ms min {min(v)/1000:.2f} busbw(median) {67108864/statistics.median(v)/1000:.2f} GB/s n={len(v)}")
PY
for cfg in "x-tls30 --psk-env FERROCCL_PSK" "x-tls30" "old-tls30 --psk-env FERROCCL_PSK"; do
set -- $cfg
.devx/$1 all_reduce -t 2 $2 $3 -b 64M -e 64M -n 400 -w 3 -c 0 >/dev/null 2>&1 &
pid=$!; sleep 4
snap() { for t in /proc/$pid/task/*; do echo "$(cat $t/comm | tr ' ' _) $(awk '{print $14+$15}' $t/stat) ${t##*/}"; done; }
snap > /tmp/a; sleep 3; snap > /tmp/b
echo "== per-thread CPU% over 3 s ($cfg)"
join -1 3 -2 3 <(sort -k3 /tmp/a) <(sort -k3 /tmp/b) | awk '{printf "%s %.0f%%\n", $2, ($5-$3)/3}' | sort | uniq -c | sort -k2
kill $pid; wait $pid 2>/dev/null
done
