#!/usr/bin/env python3
# ab_pairs.py COLL REPS NP BIN... : runs ferroccl-bench binaries (MPI builds) alternately under
# mpirun -np NP --bind-to none --oversubscribe, REPS times (order reversed every other rep), sizes
# 8 B to $MAXB (default 2K) doubling, $ITERS timed calls (default 20000) and 2000 warm-up calls
# per size, and prints per size the min and median over reps of the out-of-place time (us, from
# the -J JSON) and, pairing the first and last binary rep by rep, the median ratio last/first
# and in how many reps the last was faster. A paired comparison survives the shared host's
# swings between reps, which move both binaries of a rep alike.
# Environment: WAIT=PCT waits (at most 120 s) before each rep until the CPUs are below PCT %
# busy (half-second samples of /proc/stat); ALL=1 also prints every value.
import json, os, statistics, subprocess, sys, tempfile, time
coll, reps, np = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bins = sys.argv[4:]
maxb = os.environ.get("MAXB", "2K")
res = {b: {} for b in bins}
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
jf = tempfile.mktemp(suffix=".json")
def busy():
    def snap():
        f = open("/proc/stat").readline().split()[1:]
        v = list(map(int, f)); return sum(v), v[3] + v[4]
    t0, i0 = snap(); time.sleep(0.5); t1, i1 = snap()
    return 100.0 * (1 - (i1 - i0) / max(1, t1 - t0))
waited = []
for r in range(reps):
    w0 = time.time()
    while os.environ.get("WAIT") and busy() > float(os.environ["WAIT"]) and time.time() - w0 < 120:
        pass
    waited.append(time.time() - w0)
    for b in (bins if r % 2 == 0 else bins[::-1]):
        subprocess.run(["mpirun", "-np", np, "--bind-to", "none", "--oversubscribe", "-x", "NCCL_SOCKET_IFNAME=lo", b, coll,
                        "-b", "8", "-e", maxb, "-f", "2", "-n", os.environ.get("ITERS", "20000"), "-w", "2000", "-J", jf],
                       capture_output=True, text=True, env=env)
        for e in json.load(open(jf))["results"]:
            res[b].setdefault(e["size"], []).append(e["oop"]["time_us"])
print("waited (s): " + " ".join(f"{w:.1f}" for w in waited))
sizes = sorted(next(iter(res.values())).keys())
if os.environ.get("ALL"):
    for b in bins:
        for s in sorted(res[b]): print(os.path.basename(b), s, " ".join(f"{v:.3f}" for v in res[b][s]))
print("size  " + "  ".join(f"{os.path.basename(b):>15}" for b in bins) + "   (min/median us)  paired: median ratio last/first, runs where last faster")
for s in sizes:
    r = [y / x for x, y in zip(res[bins[0]][s], res[bins[-1]][s])]
    print(f"{s:5d} " + "  ".join(f"{min(res[b][s]):7.3f}/{statistics.median(res[b][s]):7.3f}" for b in bins)
          + f"   {statistics.median(r):.2f}  {sum(1 for x in r if x < 1)}/{len(r)}")
