#!/usr/bin/env python3
"""Per-job timeline of staged calls that run as separate operations (32 MiB and up): each
call's jobs in order, from the library's TRACE (NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL).
For job k of a call, medians over the calls (the first two left out), us: when the worker
got it (from the call's first job), how long it then waited for its input to land ('ready'),
the host engine's time, when it released the streams (from the first job), and the gap
between the previous job's release and this one's engine start.

    jobs.py JOBS_PER_CALL trace.host.PID [...]
"""
import re
import statistics
import sys

DONE = re.compile(r"staged job (\d+): inputs ready after (\d+) us, host engine (\d+) us; "
                  r"worker got it @(\d+) and released the streams @(\d+)")


def jobs(path):
    out = {}
    for line in open(path, errors="replace"):
        m = DONE.search(line)
        if m:
            n, ready, engine, got, rel = map(int, m.groups())
            out[n] = dict(ready=ready, engine=engine, got=got, released=rel)
    return out


def main():
    per_call = int(sys.argv[1])
    for path in sys.argv[2:]:
        j = jobs(path)
        calls = sorted({(n - 1) // per_call for n in j})
        rows = {}
        for c in calls[2:]:
            first = c * per_call + 1
            if any(first + k not in j for k in range(per_call)):
                continue
            t0 = j[first]["got"]
            prev_rel = None
            for k in range(per_call):
                x = j[first + k]
                start = x["got"] + x["ready"]
                gap = start - prev_rel if prev_rel is not None else float("nan")
                rows.setdefault(k, []).append(
                    (x["got"] - t0, x["ready"], x["engine"], x["released"] - t0, gap))
                prev_rel = x["released"]
        n_calls = len(next(iter(rows.values()), []))
        print(f"# {path}: {n_calls} calls of {per_call} jobs; medians, us")
        print("#  job      got    ready   engine released      gap")
        for k, vs in sorted(rows.items()):
            med = [statistics.median([v for v in col if v == v] or [float("nan")]) for col in zip(*vs)]
            print("  %4d " % k + " ".join("%8.0f" % v for v in med))


main()
