#!/usr/bin/env python3
"""The operations of a training step on this machine's roofline, from --profile tables.

  python3 scripts/roofline_plot.py OUT.png LABEL=LOG [LABEL=LOG ...]

Each LOG is a trainer's output with --profile (or make bench-cpu's build/bench_cpu_profile.txt).
One panel per LOG: x is an operation's arithmetic intensity (FLOPs per byte it must move), y the
GFLOP/s it achieved; the roof is min(peak, bandwidth x intensity) with the two ceilings the run
measured. An operation on the sloped part is memory-bound, on the flat part compute-bound; its
distance below the roof is what a better kernel could still win. Operations that compute nothing
(zeroing the gradients) or only communicate have no point. Also prints the points as a table.
"""
import re
import sys


def parse(path):
    peak = bw = None
    rows = []
    for line in open(path):
        m = re.search(r"bound: max\(FLOPs / ([0-9.]+) GFLOP/s, bytes / ([0-9.]+) GB/s\)", line)
        if m:
            peak, bw = float(m.group(1)), float(m.group(2))
            continue
        f = line.split()
        parts = [i for i, w in enumerate(f) if w in ("fwd", "bwd", "update")]
        if not parts or len(f) < parts[0] + 12:
            continue
        i = parts[0]
        try:
            ms, gflop, intensity, gflops = float(f[i + 2]), float(f[i + 4]), float(f[i + 6]), float(f[i + 7])
        except ValueError:
            continue
        rows.append({"name": " ".join(f[:i]), "part": f[i], "ms": ms, "gflop": gflop, "intensity": intensity,
                     "gflops": gflops, "bound_by": f[-1]})
    if peak is None:
        sys.exit(f"{path}: no --profile table in it")
    return peak, bw, rows


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], []
    for arg in sys.argv[2:]:
        label, _, path = arg.partition("=")
        runs.append((label, *parse(path)))
    for label, peak, bw, rows in runs:
        print(f"{label}: peak {peak} GFLOP/s, bandwidth {bw} GB/s, ridge {peak / bw:.1f} FLOP/byte")
        for r in rows:
            if r["intensity"] > 0:
                roof = min(peak, bw * r["intensity"])
                print(f"  {r['name']:<20} {r['part']:<6} {r['intensity']:8.2f} FLOP/B {r['gflops']:8.1f} GFLOP/s "
                      f"(roof {roof:7.1f}, {r['bound_by']}-bound)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib (bash scripts/install_deps.sh --lab): no plot")
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 5), squeeze=False)
    for ax, (label, peak, bw, rows) in zip(axes[0], runs):
        xs = [0.05 * 1.2 ** k for k in range(60)]
        ax.plot(xs, [min(peak, bw * x) for x in xs], color="black", lw=2, label="roof: min(peak, bandwidth x I)")
        ax.axvline(peak / bw, color="gray", ls=":", lw=1)
        ax.text(peak / bw * 1.08, peak * 0.03, f"ridge {peak / bw:.1f} FLOP/B", color="gray", fontsize=8)
        for part, marker, color in (("fwd", "o", "tab:blue"), ("bwd", "s", "tab:orange"), ("update", "^", "tab:green")):
            pts = [r for r in rows if r["part"] == part and r["intensity"] > 0 and r["gflops"] > 0]
            ax.scatter([r["intensity"] for r in pts], [r["gflops"] for r in pts],
                       s=[20 + 400 * r["ms"] / max(x["ms"] for x in rows) for r in pts], marker=marker, color=color,
                       alpha=0.7, label=part)
            for r in pts:   # the matmuls crowd one spot: one label for them all
                if not r["name"].startswith("matmul"):
                    ax.annotate(r["name"], (r["intensity"], r["gflops"]), fontsize=7, xytext=(4, -3),
                                textcoords="offset points")
        mm = [r for r in rows if r["name"].startswith("matmul") and r["gflops"] > 0]
        if mm:
            top = max(mm, key=lambda r: r["ms"])
            ax.annotate(f"matmuls ({len(mm)} rows)", (top["intensity"], top["gflops"]), fontsize=7, xytext=(-30, -22),
                        textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_title(f"{label}: peak {peak:.0f} GFLOP/s, {bw:.1f} GB/s (marker area: time)", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
