#!/usr/bin/env python3
"""Tables from survey lines "label npN coll size oop_us ip_us" (survey.sh, round143.sh,
round144.sh): per rank count and collective, a row per size with each label's out-of-place
times over the launches (min-max), in-place in brackets.
    table.py FILE... [--labels default,slots,memalloc,ompi]"""
import sys
from collections import defaultdict

args = [a for a in sys.argv[1:] if not a.startswith("--")]
labels = None
for a in sys.argv[1:]:
    if a.startswith("--labels="):
        labels = a.split("=", 1)[1].split(",")
cells = defaultdict(lambda: defaultdict(list))
order = []
for path in args:
    for line in open(path):
        f = line.split()
        if len(f) != 6:
            continue
        label, np, coll, size, oop, ip = f
        try:
            oop, ip = float(oop), float(ip)
        except ValueError:
            continue
        key = (np, coll)
        if key not in order:
            order.append(key)
        cells[key][(size, label)].append((oop, ip))
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
def nbytes(s):
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)
def rng(v):
    lo, hi = min(v), max(v)
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"
for key in order:
    np, coll = key
    sizes = sorted({s for s, _ in cells[key]}, key=nbytes)
    labs = labels or sorted({l for _, l in cells[key]})
    print(f"\n{coll}, {np[2:]} ranks (us, out of place [in place])\n")
    print("| size | " + " | ".join(labs) + " |")
    print("|---" * (len(labs) + 1) + "|")
    for s in sizes:
        row = []
        for l in labs:
            v = cells[key].get((s, l))
            row.append(f"{rng([a for a, _ in v])} [{rng([b for _, b in v])}]" if v else "")
        print(f"| {s} | " + " | ".join(row) + " |")
