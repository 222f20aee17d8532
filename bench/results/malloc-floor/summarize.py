#!/usr/bin/env python3
"""Tables for vm-heap.sh outputs: per rank count and size, the range over launches of each
mode's out-of-place time [in place], and launch-by-launch ratios (launches paired by order)."""
import sys
from collections import defaultdict

rows = defaultdict(lambda: defaultdict(list))
for path in sys.argv[1:]:
    for line in open(path):
        f = line.split()
        if len(f) != 6 or not f[1].startswith("np"):
            continue
        mode, np_, size, oop, inp = f[0], int(f[1][2:]), f[3], float(f[4]), float(f[5])
        rows[(np_, size)][mode].append((oop, inp))

def rng(v, i):
    a = [x[i] for x in v]
    lo, hi = min(a), max(a)
    fmt = (lambda x: f"{x:.0f}") if hi >= 100 else (lambda x: f"{x:.1f}")
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"

def ratio(a, b):
    r = [x[0] / y[0] for x, y in zip(a, b)]
    return f"{min(r):.2f}-{max(r):.2f}"

order = ["128K", "256K", "512K", "1M", "2M", "4M", "8M"]
for np_ in sorted({k[0] for k in rows}):
    print(f"\nall_reduce, {np_} ranks (us, out of place [in place]; ratios launch by launch, out of place)\n")
    print("| size | default | heap opt-in | ncclMemAlloc | Open MPI | default / mem | heap / mem | Open MPI / default |")
    print("|---|---|---|---|---|---|---|---|")
    for s in order:
        m = rows.get((np_, s))
        if not m:
            continue
        cells = [f"{rng(m[k], 0)} [{rng(m[k], 1)}]" for k in ("def", "heap", "mem", "ompi")]
        print(f"| {s} | " + " | ".join(cells) + f" | {ratio(m['def'], m['mem'])} | {ratio(m['heap'], m['mem'])} | {ratio(m['ompi'], m['def'])} |")
