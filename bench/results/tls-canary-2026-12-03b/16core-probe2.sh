#!/bin/bash
export NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo FERROCCL_PSK=0123456789abcdef0123456789abcdef0123
echo "# $(date -u)"
run() { # label envs bin coll args
  t=$(env $2 timeout 60 $3 $4 -t 2 $5 -b 64M -e 64M -n 20 -w 3 -c 0 2>&1 | awk '/^ *67108864/{print $6, $10}')
  echo "$1 $t"
}
P="--psk-env FERROCCL_PSK"
for r in 1 2 3; do
 for b in x-tls30 x-tls36; do
  B=.devx/$b
  for cfg in default FERROCCL_CHUNK_SIZE=1M FERROCCL_CHUNK_SIZE=2M FERROCCL_CHUNK_SIZE=4M NCCL_SOCKET_NTHREADS=2 NCCL_SOCKET_NTHREADS=6; do
    e=$cfg; [ $cfg = default ] && e=
    run $b-ar-$cfg-plain "$e" $B all_reduce ""
    run $b-ar-$cfg-tls "$e XWF=524288" $B all_reduce "$P"
  done
  run $b-ag-plain "" $B all_gather ""
  run $b-ag-tls "XWF=524288" $B all_gather "$P"
 done
done > $OUT/probe2.txt
python3 - $OUT/probe2.txt <<'PY'
import sys,collections,statistics
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
  p=l.split()
  if len(p)==3: d[p[0]]+=[float(p[1]),float(p[2])]
keys=list(d)
for k in keys:
  if k.endswith('-plain'):
    b=k[:-6]; pl=statistics.median(d[k]); tl=statistics.median(d.get(b+'-tls',[0]))
    print(f"{b:40s} plain {pl/1000:6.2f} ms  tls {tl/1000:6.2f} ms  ratio {pl/tl if tl else 0:.2f}  (min {min(d[k])/1000:.2f}/{min(d.get(b+'-tls',[0]))/1000:.2f})")
PY
