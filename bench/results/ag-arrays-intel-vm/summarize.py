import re,collections,sys
d=collections.defaultdict(lambda: collections.defaultdict(list))
v=None
for l in open(sys.argv[1]):
    m=re.match(r'== rep \d+ variant (\S+)',l)
    if m: v=m.group(1); continue
    p=l.split()
    if len(p)==2: d[int(p[0])][v].append(float(p[1]))
for s in sorted(d):
    print(s, "  ".join(f"{k[-12:]}: "+",".join(f"{x:.1f}" for x in vs) for k,vs in d[s].items()))
