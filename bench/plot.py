#!/usr/bin/env python3
"""Plot bench/compare_ompi.sh results: busbw against size (log x), ferroccl and Open MPI, one
panel per collective (rows) and rank count (columns); with --both-allocs runs also ferroccl on
ncclMemAlloc buffers (the main ferroccl line is then its malloc'd buffers).

    python3 bench/plot.py RESULTS.json [OUT.png]

Optional: needs matplotlib (pip install matplotlib). Without it, it says so and exits 0 without
writing a PNG; nothing else depends on this script.
"""
import json
import os
import sys


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src = sys.argv[1]
    dst = sys.argv[2] if len(sys.argv) == 3 else os.path.splitext(src)[0] + ".png"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        print("# plot.py: matplotlib is not installed (pip install matplotlib); skipping the PNG")
        return 0

    with open(src) as f:
        data = json.load(f)
    runs = data["runs"]
    colls = [
        c
        for c in ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
        if any(r["collective"] == c for r in runs)
    ]
    nps = sorted({r["nranks"] for r in runs})

    def human(b, _pos=None):
        for unit, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if b >= s:
                return f"{b / s:g}{unit}"
        return f"{b:g}"

    fig, axes = plt.subplots(len(colls), len(nps), figsize=(5.2 * len(nps), 3.6 * len(colls)), squeeze=False)
    for i, coll in enumerate(colls):
        for j, n in enumerate(nps):
            ax = axes[i][j]
            run = next((r for r in runs if r["collective"] == coll and r["nranks"] == n), None)
            if run is None:
                ax.set_visible(False)
                continue
            rows = [x for x in run["rows"] if x["size"] > 0]
            both = any(x.get("ferroccl_mem") for x in rows)
            series = (
                ("ferroccl", "ferroccl, malloc'd" if both else "ferroccl", "o-"),
                ("ferroccl_mem", "ferroccl, ncclMemAlloc", "^-."),
                ("ompi", "Open MPI", "s--"),
            )
            for lib, label, style in series:
                pts = [(x["size"], x[lib]["oop"]["busbw"]) for x in rows if x.get(lib)]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, ms=3.5, label=label)
            if coll == "all_reduce":
                pts = [(x["size"], 2 * x["ompi"]["oop"]["busbw"]) for x in rows if x["ompi"] and x["size"] >= 1 << 20]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ":", marker="_", color="gray", label="target: 2x Open MPI")
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(human))
            ax.set_title(f"{coll}, {n} ranks")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel("busbw (GB/s)")
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=8)
    meta = data.get("meta", {})
    fig.suptitle(
        f"ferroccl vs {meta.get('ompi_version', 'Open MPI')}, out-of-place busbw\n"
        f"{meta.get('cpu_model', '')}, {meta.get('cpus', '?')} CPUs; {meta.get('date', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"# plot.py: wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
