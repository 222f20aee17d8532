#!/usr/bin/env python3
"""Round 148: per launch, from r148/stat.txt (per-CPU /proc/stat every 50 ms) and the launch
stamps in r148/stall.txt: (1) each CPU's idle share over the launch's polling span (below),
(2) the intervals inside that span in
which one CPU was mostly idle (> 80%) while the other 15 were busy (< 20% idle), which is what
two ranks on one core look like. The polling span runs from the first interval with at least
15 CPUs busy to the last."""
import re, sys
d = sys.argv[1] if len(sys.argv) > 1 else "r148"
spans = []
for l in open(f"{d}/stall.txt"):
    m = re.match(r"== (\S+) (start|end) ([0-9.]+)", l)
    if m and m.group(2) == "start":
        cur = [m.group(1), float(m.group(3))]
    elif m:
        spans.append(cur + [float(m.group(3))])
snaps = []
for blk in open(f"{d}/stat.txt").read().split("T ")[1:]:
    lines = blk.strip().split("\n")
    cpus = {}
    for x in lines[1:]:
        f = x.split()
        v = list(map(int, f[1:9]))
        cpus[int(f[0][3:])] = (sum(v), v[3] + v[4])
    snaps.append((float(lines[0]), cpus))
for name, a, b in spans:
    ins = [s for s in snaps if a <= s[0] <= b]
    iv = []
    for (t0, c0), (t1, c1) in zip(ins, ins[1:]):
        idle = [(c1[c][1] - c0[c][1]) / max(1, c1[c][0] - c0[c][0]) for c in sorted(c0)]
        iv.append((t0 - a, idle))
    # From the first interval with at least 15 CPUs busy (16 ranks polling, or 15 with two on
    # one core) to the last.
    busy = [k for k, (_, idle) in enumerate(iv) if sorted(idle)[-2] < 0.2]
    if not busy:
        print(f"{name:14s} no interval with every CPU busy"); continue
    lo, hi = busy[0], busy[-1]
    span = iv[lo:hi + 1]
    share = [sum(x[1][c] for x in span) / len(span) for c in range(len(span[0][1]))]
    lone = [(round(t, 2), c) for t, idle in span for c in range(len(idle))
            if idle[c] > 0.8 and sorted(idle)[-2] < 0.2]
    print(f"{name:14s} span {span[0][0]:.2f}-{span[-1][0]+0.05:.2f}s idle% " + " ".join(f"{100*x:.0f}" for x in share)
          + (f"  one CPU idle, others busy at (s, cpu): {lone}" if lone else ""))
