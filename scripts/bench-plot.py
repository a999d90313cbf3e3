#!/usr/bin/env python3
"""Plots `uroce bench --json` results.

Usage: scripts/bench-plot.py RESULT.json [MORE.json ...] [-o DIR] [--label NAME ...]

Writes into DIR (default: the directory of the first file):
  bench-bw.png   bandwidth (Gb/s) vs message size, one line per op/QP count and
                 run, with the raw UDP GSO+GRO limit measured in the same run
  bench-lat.png  latency (µs, median; --p99 adds the 99th percentile) vs
                 message size, with the raw UDP busy-poll ping-pong half round trip
A plot is skipped when no file has points for it. Needs matplotlib
(Debian: apt-get install python3-matplotlib).
"""
import argparse
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    # Debian's python3-matplotlib lives with /usr/bin/python3, which another
    # python3 first in PATH (pyenv, a venv) does not see.
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    sys.exit("bench-plot: needs matplotlib (Debian: apt-get install python3-matplotlib)")


def size_label(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def series(results, metric):
    """{(op, qps, unit): [(size, result, p99)]} sorted by size."""
    out = {}
    for r in results:
        if r["metric"] != metric:
            continue
        out.setdefault((r["op"], r["qps"], r["unit"]), []).append((r["size"], r["result"], r.get("p99")))
    return {k: sorted(v) for k, v in out.items()}


def setup_axes(ax, sizes, ylabel, title):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if sizes:
        ticks = sorted(sizes)
        if len(ticks) > 11:
            ticks = ticks[:: (len(ticks) + 10) // 11]
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(s) for s in ticks], rotation=45, ha="right")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


def plot_bw(runs, path):
    fig, ax = plt.subplots(figsize=(9, 5.5))
    sizes = set()
    drawn = False
    for label, d in runs:
        mtu = d.get("setup", {}).get("path_mtu", 4096)
        for (op, qps, _unit), pts in series(d["results"], "bw").items():
            xs = [p[0] for p in pts]
            sizes.update(xs)
            ax.plot(xs, [p[1] for p in pts], marker="o", label=f"uroce {op}, {qps} QP{'s' if qps > 1 else ''}{label}")
            drawn = True
        # The UDP limit per message size: the stream with that size's datagram.
        streams = {s["segment"]: s["gbps"] for s in d.get("baselines", {}).get("udp_stream", [])}
        bw_sizes = sorted({r["size"] for r in d["results"] if r["metric"] == "bw"})
        base = [(s, streams.get(min(s, mtu) + 16)) for s in bw_sizes]
        base = [(s, g) for s, g in base if g]
        if base:
            ax.plot([b[0] for b in base], [b[1] for b in base], "k--", marker="x",
                    label=f"raw UDP GSO+GRO (same datagram size){label}")
    if not drawn:
        plt.close(fig)
        return False
    setup_axes(ax, sizes, "Gb/s (message payload)", "Bandwidth vs message size (loopback, 2 processes)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_lat(runs, path, with_p99):
    fig, ax = plt.subplots(figsize=(9, 5.5))
    sizes = set()
    drawn = False
    for label, d in runs:
        for (op, _qps, unit), pts in series(d["results"], "lat").items():
            xs = [p[0] for p in pts]
            sizes.update(xs)
            what = "half RTT" if "half" in unit else "RTT"
            line = ax.plot(xs, [p[1] for p in pts], marker="o", label=f"uroce {op} ({what}, median){label}")[0]
            p99 = [p[2] for p in pts]
            if with_p99 and all(v is not None for v in p99):
                ax.plot(xs, p99, linestyle=":", color=line.get_color(), label=f"uroce {op} p99{label}")
            drawn = True
        pp = d.get("baselines", {}).get("udp_pingpong")
        if pp and sizes:
            ax.axhline(pp["half_rtt_median_us"], color="k", linestyle="--",
                       label=f"raw UDP 64 B busy-poll ping-pong, half RTT{label}")
    if not drawn:
        plt.close(fig)
        return False
    ax.set_yscale("log")
    setup_axes(ax, sizes, "µs (log scale)", "Latency vs message size (loopback, 2 processes)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON files written by uroce bench --json")
    ap.add_argument("-o", "--out", help="output directory")
    ap.add_argument("--p99", action="store_true", help="also draw the latency p99 lines")
    ap.add_argument("--label", action="append", help="legend label per file (default: file name when several)")
    a = ap.parse_args()
    runs = []
    for i, f in enumerate(a.files):
        with open(f) as fh:
            d = json.load(fh)
        if a.label and i < len(a.label):
            label = f" [{a.label[i]}]"
        elif len(a.files) > 1:
            label = f" [{os.path.splitext(os.path.basename(f))[0]}]"
        else:
            label = ""
        runs.append((label, d))
    out = a.out or os.path.dirname(os.path.abspath(a.files[0]))
    os.makedirs(out, exist_ok=True)
    wrote = []
    plots = (("bench-bw.png", plot_bw), ("bench-lat.png", lambda r, p: plot_lat(r, p, a.p99)))
    for name, fn in plots:
        path = os.path.join(out, name)
        if fn(runs, path):
            wrote.append(path)
    if not wrote:
        sys.exit("bench-plot: no results to plot")
    for p in wrote:
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
