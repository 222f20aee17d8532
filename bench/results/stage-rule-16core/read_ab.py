#!/usr/bin/env python3
"""Reads ab_stage.sh output (kernel copies 'stage_max=0' vs slots 'stage_max=1T', with the rule
each cell's size took at c08fc6b) or ab_rule.sh output ('new' vs 'old'), one line per
collective, rank count and size with every repeat and the ratio of the minimums."""
import collections, re, sys

K, M, INF = 1024, 1024 * 1024, 1 << 62


def rule_c08fc6b(coll, n):
    """node::default_stage_max before this round (not oversubscribed)."""
    return {
        'all_reduce': 16 * K if n <= 2 else 128 * K,
        'reduce_scatter': INF if n <= 2 else (M if n <= 8 else 128 * K),
        'all_gather': 16 * K if n <= 2 else (INF if n <= 8 else M),
        'broadcast': 0 if n <= 2 else INF,
    }[coll]


d = collections.defaultdict(list)
mode = None
for line in open(sys.argv[1]):
    m = re.match(r'(\w+) np(\d+) rep\d+ (?:stage_max=)?(\S+)\s+(.*)', line)
    if not m:
        continue
    coll, n, which, rest = m.groups()
    mode = 'stage' if which in ('0', '1T') else 'rule'
    v = rest.split()
    for i in range(0, len(v) - 1, 2):
        d[(coll, int(n), int(v[i]), which)].append(float(v[i + 1]))
a_key, b_key = ('0', '1T') if mode == 'stage' else ('new', 'old')
for coll, n in sorted({(k[0], k[1]) for k in d}):
    for size in sorted({k[2] for k in d if k[0] == coll and k[1] == n}):
        a, b = d[(coll, n, size, a_key)], d[(coll, n, size, b_key)]
        if not a or not b:
            continue
        fmt = lambda xs: '/'.join('%.1f' % x for x in xs)
        line = f"{coll:15s} np{n:<2d} {size // K:>6d}K {a_key} {fmt(a):>24s} {b_key} {fmt(b):>24s}"
        if mode == 'stage':
            pick = 'slots' if size <= rule_c08fc6b(coll, n) else 'kernel'
            best = 'slots' if min(b) < min(a) else 'kernel'
            line += f"  rule {pick:6s} faster {best:6s} {max(min(a), min(b)) / min(min(a), min(b)):.2f}x"
        else:
            line += f"  old/new {min(b) / min(a):.2f}"
        print(line)
