import re,sys,collections
d=collections.defaultdict(list)
cur=None
for line in open(sys.argv[1]):
    m=re.match(r'## np (\d+) (\S+) rep (\d+) (\w)',line)
    if m: cur=(int(m.group(1)),m.group(2),m.group(4)); continue
    f=line.split()
    if cur and len(f)>=13 and f[0].isdigit():
        d[cur+(int(f[0]),)].append((float(f[5]),float(f[9])))
keys=sorted(set((k[0],k[1],k[3]) for k in d))
print("np coll size | A oop (runs) | B oop | A ip | B ip")
for np_,c,s in keys:
    A=d.get((np_,c,'A',s),[]);B=d.get((np_,c,'B',s),[])
    fmt=lambda v:' '.join('%.0f'%x if x>=100 else '%.1f'%x for x in v)
    print(f"{np_} {c:10s} {s:>10d} | {fmt([a[0] for a in A]):24s} | {fmt([b[0] for b in B]):24s} | {fmt([a[1] for a in A]):24s} | {fmt([b[1] for b in B])}")
