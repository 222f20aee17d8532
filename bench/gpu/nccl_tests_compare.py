#!/usr/bin/env python3
"""Side-by-side table of two nccl-tests logs of the same test (ferroccl's build and NCCL's).

    bench/gpu/nccl_tests_compare.py FERROCCL_LOG NCCL_LOG [--title TEXT]
        [--large 64M] [--min-busbw-ratio 0.9] [--max-latency-ratio 1.5]

Prints a markdown table: per size, both libraries' out-of-place and in-place time and busbw,
the busbw ratio ferroccl / NCCL (out of place; in place in brackets; computed from the times,
NCCL's time over ferroccl's, which is the busbw ratio of one size without the logs' rounding of
small busbw to 0.00) and both #wrong columns,
then a verdict against issue 18's goals: busbw >= MIN-BUSBW-RATIO x NCCL's at every size from
LARGE, the smallest size's time <= MAX-LATENCY-RATIO x NCCL's, and #wrong 0 with "Out of bounds
values : 0 OK" on both sides. Exit status 0 whatever the verdict (1 if a log cannot be read or
holds no rows, 2 on bad arguments). Standard library only.
"""
import argparse
import re
import sys

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64M)")
    return int(m.group(1)) * UNITS[m.group(2)]


def read_log(path):
    """Rows {size: (oop_time, oop_busbw, oop_wrong, ip_time, ip_busbw, ip_wrong)}, whether the
    out-of-bounds line said OK, and the nccl-tests header line naming the library."""
    rows, bounds_ok, header = {}, False, ""
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("# nccl-tests version"):
                header = line[2:].strip()
            if re.match(r"#\s*Out of bounds values\s*:\s*0 OK", line):
                bounds_ok = True
            fields = line.split()
            # size count type redop root time algbw busbw #wrong time algbw busbw #wrong; the
            # sendrecv/alltoall tables have the same columns.
            if len(fields) < 13 or not fields[0].isdigit() or not fields[1].isdigit():
                continue
            tail = fields[-8:]
            try:
                oop = (float(tail[0]), float(tail[2]), tail[3])
                ip = (float(tail[4]), float(tail[6]), tail[7])
            except ValueError:
                continue
            rows[int(fields[0])] = oop + ip
    return rows, bounds_ok, header


def human(size):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}iB"
    return f"{size} B"


def ratio(a, b):
    return a / b if b > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ferroccl_log")
    ap.add_argument("nccl_log")
    ap.add_argument("--title", default="")
    ap.add_argument("--large", type=parse_size, default=64 << 20)
    ap.add_argument("--min-busbw-ratio", type=float, default=0.9)
    ap.add_argument("--max-latency-ratio", type=float, default=1.5)
    args = ap.parse_args()
    try:
        ours, ours_ok, ours_header = read_log(args.ferroccl_log)
        theirs, theirs_ok, theirs_header = read_log(args.nccl_log)
    except OSError as e:
        print(f"nccl_tests_compare: {e}", file=sys.stderr)
        return 1
    if not ours or not theirs:
        empty = args.ferroccl_log if not ours else args.nccl_log
        print(f"nccl_tests_compare: no result rows in {empty}", file=sys.stderr)
        return 1
    sizes = sorted(set(ours) & set(theirs))
    if args.title:
        print(f"### {args.title}\n")
    print(f"- ferroccl: `{args.ferroccl_log}` ({ours_header or 'no header'})")
    print(f"- NCCL: `{args.nccl_log}` ({theirs_header or 'no header'})\n")
    print("| size | ferroccl us (oop / ip) | NCCL us (oop / ip) | ferroccl busbw GB/s | NCCL busbw GB/s "
          "| busbw ratio oop (ip) | #wrong ferroccl / NCCL |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        o, t = ours[s], theirs[s]
        print(f"| {human(s)} | {o[0]:.2f} / {o[3]:.2f} | {t[0]:.2f} / {t[3]:.2f} | {o[1]:.2f} | {t[1]:.2f} "
              f"| {ratio(t[0], o[0]):.2f} ({ratio(t[3], o[3]):.2f}) | {o[2]}/{o[5]} / {t[2]}/{t[5]} |")
    large = [s for s in sizes if s >= args.large]
    worst = min(large, key=lambda s: ratio(theirs[s][0], ours[s][0])) if large else None
    small = sizes[0]
    latency = ratio(ours[small][0], theirs[small][0])
    wrong = [s for s in sizes if any(w not in ("0", "N/A") for w in (ours[s][2], ours[s][5]))]
    print()
    if worst is None:
        print(f"- busbw from {human(args.large)}: no such size in both logs")
    else:
        r = ratio(theirs[worst][0], ours[worst][0])
        verdict = "met" if r >= args.min_busbw_ratio else "NOT met"
        print(f"- busbw from {human(args.large)}: worst {r:.2f}x NCCL's at {human(worst)} "
              f"(goal >= {args.min_busbw_ratio}x): {verdict}")
    verdict = "met" if latency <= args.max_latency_ratio else "NOT met"
    print(f"- latency at {human(small)}: {ours[small][0]:.2f} against {theirs[small][0]:.2f} us = {latency:.2f}x "
          f"(goal <= {args.max_latency_ratio}x): {verdict}")
    print(f"- ferroccl #wrong: {'0 at every size' if not wrong else 'NOT 0 at ' + ', '.join(map(human, wrong))}; "
          f"out of bounds line OK: ferroccl {'yes' if ours_ok else 'NO'}, NCCL {'yes' if theirs_ok else 'NO'}")
    only = sorted(set(ours) ^ set(theirs))
    if only:
        print(f"- sizes in one log only: {', '.join(map(human, only))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
