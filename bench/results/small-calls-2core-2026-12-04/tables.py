#!/usr/bin/env python3
# tables2.py "BEFORE1.json,BEFORE2.json" "AFTER1.json,AFTER2.json"
# Per size: fastest out-of-place time over every repeat of every run (before, after), and Open
# MPI's fastest over all runs (its sweeps ran alternately with both); ratio = Open MPI time /
# ferroccl time (= busbw ratio at equal size).
import json, sys
def load(paths):
    t, o, wrong = {}, {}, 0
    for p in paths.split(','):
        d = json.load(open(p))
        for run in d['runs']:
            for r in run['rows']:
                k = (run['nranks'], run['collective'], r['size'])
                rep = r.get('repeats', {})
                ft = rep.get('ferroccl_oop_time_us') or [r['ferroccl']['oop']['time_us']]
                ot = rep.get('ompi_oop_time_us') or [r['ompi']['oop']['time_us']]
                t.setdefault(k, []).extend(ft); o.setdefault(k, []).extend(ot)
                wrong += (r['ferroccl']['oop'].get('wrong') or 0) + (r['ferroccl']['ip'].get('wrong') or 0)
    return t, o, wrong
tb, ob, wb = load(sys.argv[1]); ta, oa, wa = load(sys.argv[2])
def fmt_size(s):
    for u, n in (('M', 1 << 20), ('K', 1 << 10)):
        if s >= n and s % n == 0: return f"{s // n} {u}iB"
    return f"{s} B"
groups = {}
for k in sorted(set(tb) & set(ta)): groups.setdefault(k[:2], []).append(k[2])
for (n, c), sizes in sorted(groups.items(), key=lambda x: (x[0][0], ['all_reduce','all_gather','broadcast','reduce_scatter'].index(x[0][1]))):
    print(f"\n**{c}, {n} ranks**\n")
    print("| size | before (us) | after (us) | after / before | Open MPI (us) | before vs Open MPI | after vs Open MPI |")
    print("|---|---|---|---|---|---|---|")
    for s in sizes:
        k = (n, c, s)
        b, a = min(tb[k]), min(ta[k])
        o = min(ob[k] + oa[k])
        if s == 0: continue  # count 0 per rank (a no-op call): not a size
        bold = lambda v: f"**{v:.2f}x**" if v < 1 else f"{v:.2f}x"
        print(f"| {fmt_size(s)} | {b:.2f} | {a:.2f} | {a/b:.2f} | {o:.2f} | {bold(o/b)} | {bold(o/a)} |")
print(f"\n#wrong (checked calls, before / after): {wb} / {wa}; samples per cell: before {len(next(iter(tb.values())))}, after {len(next(iter(ta.values())))}, Open MPI {len(next(iter(ob.values())))*2}")
