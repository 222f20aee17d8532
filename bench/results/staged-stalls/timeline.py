#!/usr/bin/env python3
"""Lines up staged_bw's device calls (STAGED_BW_DETAIL=1: wall-clock start and end per rank)
with the library's TRACE of the same jobs (NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL), per rank:
when the enqueue began, handed the job to the worker and ended, when the worker took the
job, the host engine's start, first and last output piece released, last event and end, and
when the worker released the streams, in us from the call's start; then the
stream's tail (call end - streams released). Prints the median of each column per size.

    timeline.py staged-X.txt trace-X.host.PID0 trace-X.host.PID1
"""
import re
import statistics
import sys


def calls(detail_path):
    out = []
    for line in open(detail_path):
        f = line.split()
        if f[:1] == ["detail"]:
            walls = re.findall(r"@(\d+)-(\d+)", line)
            out.append((int(f[1]), float(f[3]), [(int(a), int(b)) for a, b in walls]))
    return out


def jobs(trace_path):
    j = {}
    for line in open(trace_path):
        m = re.search(r"staged job (\d+): enqueue began @(\d+), handed to the worker @(\d+), queued @(\d+)", line)
        if m:
            j.setdefault(int(m[1]), {}).update(began=int(m[2]), handed=int(m[3]), queued=int(m[4]))
            continue
        m = re.search(r"staged job (\d+): (\d+) us from @(\d+) \(wall us\); (.*?); plan", line)
        if m:
            t0 = int(m[3])
            ev = [int(x) for x in re.findall(r"@(\d+)", m[4])]
            rel = [int(x) for x in re.findall(r"\bR\d+@(\d+)", m[4])]
            j.setdefault(int(m[1]), {}).update(engine0=t0, first_rel=t0 + min(rel) if rel else None,
                                               last_rel=t0 + max(rel) if rel else None,
                                               last_ev=t0 + max(ev) if ev else t0, engine1=t0 + int(m[2]))
            continue
        m = re.search(r"staged job (\d+): inputs ready after (\d+) us, host engine (\d+) us; worker got it @(\d+) and released the streams @(\d+)", line)
        if m:
            j.setdefault(int(m[1]), {}).update(got=int(m[4]), released=int(m[5]))
    return j


def main():
    detail, traces = sys.argv[1], sys.argv[2:]
    cs = calls(detail)
    per_rank = [jobs(t) for t in traces]
    # Each trace file is one rank; which one is rank 0 is found by matching the first call's
    # enqueue to the detail line's starts.
    cols = ["call", "began", "handed", "queued", "got", "engine0", "first_rel", "last_rel", "last_ev", "engine1",
            "released", "end"]
    rows = {}
    for k, (mib, us, walls) in enumerate(cs):
        for r, j in enumerate(per_rank):
            job = j.get(k + 1)
            if not job or r >= len(walls) or "released" not in job:
                continue
            start, end = walls[r] if len(per_rank) == len(walls) else walls[0]
            v = [us] + [(job.get(c) - start) if job.get(c) is not None else float("nan") for c in cols[1:-1]] + [end - start]
            rows.setdefault((mib, r), []).append(v)
    print("# median over the calls of each size (first call of each size left out), us from the call's start")
    print("# %4s %4s " % ("MiB", "rank") + " ".join("%9s" % c for c in cols))
    for (mib, r), vs in sorted(rows.items()):
        vs = vs[1:]
        med = [statistics.median([x for x in col if x == x] or [float("nan")]) for col in zip(*vs)]
        print("  %4d %4d " % (mib, r) + " ".join("%9.0f" % x for x in med))


main()
