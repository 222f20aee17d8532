import re,sys,collections
txt=open(sys.argv[1]).read()
# records: label np4 coll size <junk> then size:oop/ip tokens until next label line
recs=re.findall(r'^(base|cand|ompi)\s+np4\s+(\S+)\s+(\S+)\s+(.*?)(?=^(?:base|cand|ompi)\s+np4|\Z)', txt, re.S|re.M)
d=collections.defaultdict(list)
for lab,coll,sz,body in recs:
    for s,o,i in re.findall(r'(\d+):([\d.]+)/([\d.]+)', body):
        d[(coll,sz if sz!='bench' else 'bench',int(s),lab)].append((float(o),float(i)))
keys=sorted({(c,z,s) for c,z,s,l in d}, key=lambda k:(k[0],k[1]=='bench',k[2]))
for c,z,s in keys:
    row=[]
    for lab in ['base','cand','ompi']:
        v=d.get((c,z,s,lab))
        if v: row.append(f"{lab} {min(a for a,_ in v):.0f}-{max(a for a,_ in v):.0f} [{min(b for _,b in v):.0f}-{max(b for _,b in v):.0f}]")
    print(f"{c:14s} {'arr' if z!='bench' else 'bench'} {s:>8d}  "+"  ".join(row))
