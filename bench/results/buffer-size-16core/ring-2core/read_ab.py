import collections,sys
d=collections.defaultdict(list); bad=0
for l in open(sys.argv[1]):
    f=l.split()
    if len(f)<3: continue
    c,v=f[0],f[1]
    for i in range(3,len(f),2):
        size=f[i]; oop,ip,w=f[i+1].split('/')
        if w not in ('w00',): bad+=1
        d[(c,size,v)].append((float(oop),float(ip)))
print("bad", bad)
for k in sorted(d, key=lambda k:(k[0],int(k[1]),k[2])):
    if int(k[1])>=128:
        o=[a for a,b in d[k]]; i=[b for a,b in d[k]]
        print(k, 'oop %.2f-%.2f'%(min(o),max(o)), 'ip %.2f-%.2f'%(min(i),max(i)))
