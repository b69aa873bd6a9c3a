#!/usr/bin/env python3
"""auto against MPI's own choice, from collbench runs (scripts/lab_auto.sh makes them).

  python3 scripts/collbench_auto_report.py OUT.png P=LOG [P=LOG ...]

Each LOG is the output of one collbench -p allreduce run with native, our algorithms and auto
(-a native,ring,...,auto) on P ranks. Prints, per rank count, a table of busbw / native busbw per
size for each algorithm, auto's ratio judged against the bar (at least 0.95 at every size, at
least 1.0 from 1 MiB up), and the crossovers: which of ours is fastest in each band of sizes.
With matplotlib, OUT.png: one panel per rank count, busbw against size for every algorithm,
auto drawn thick.
"""
import sys


def parse(path, p):
    """{algorithm: {size: busbw}} from collbench's rows (lines that start with the size); busbw
    from the time column (the busbw column has 3 decimals: 0 for the smallest sizes)"""
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) < 9 or line.startswith("#") or not f[0].isdigit():
            continue
        size, algo, us = int(f[0]), f[5], float(f[6])
        rows.setdefault(algo, {})[size] = size / (us * 1e-6) / 1e9 * 2 * (p - 1) / p if us > 0 else 0.0
    return rows


def human(b):
    for unit, k in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << k and b % (1 << k) == 0:
            return f"{b >> k}{unit}"
    return str(b)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], []
    for arg in sys.argv[2:]:
        p, path = arg.split("=", 1)
        runs.append((int(p), parse(path, int(p))))
    for p, rows in runs:
        if "native" not in rows or "auto" not in rows:
            sys.exit(f"p={p}: the log needs native and auto rows")
        ours = [a for a in rows if a not in ("native",)]
        sizes = sorted(rows["native"])
        print(f"\n{p} ranks: busbw / native busbw")
        print(f"| size | {' | '.join(ours)} | auto vs the bar |")
        print("|---:|" + "---:|" * len(ours) + "---|")
        bad = 0
        for s in sizes:
            nat = rows["native"][s]
            ratios = [rows[a].get(s, 0) / nat if nat > 0 else 0 for a in ours]
            r = rows["auto"].get(s, 0) / nat if nat > 0 else 0
            bar = 1.0 if s >= 1 << 20 else 0.95
            ok = r >= bar
            bad += not ok
            print(f"| {human(s)} | " + " | ".join(f"{x:.2f}" for x in ratios) + f" | {'ok' if ok else 'BELOW'} (>= {bar:.2f}) |")
        # the crossover: our fastest per band of sizes (auto left out: it is one of them)
        bands, last = [], None
        for s in sizes:
            best = max((a for a in ours if a != "auto"), key=lambda a: rows[a].get(s, 0))
            if best != last:
                bands.append([s, s, best])
                last = best
            else:
                bands[-1][1] = s
        print("our fastest by size: " + ", ".join(f"{b[2]} {human(b[0])}..{human(b[1])}" for b in bands))
        print(f"auto: {len(sizes) - bad} of {len(sizes)} sizes at or above the bar")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), squeeze=False)
    for ax, (p, rows) in zip(axes[0], runs):
        for a, pts in rows.items():
            xs = sorted(pts)
            style = dict(lw=3, color="black") if a == "auto" else dict(lw=1.2, ls="--" if a == "native" else "-")
            ax.plot(xs, [pts[x] for x in xs], marker="o", ms=3, label=a, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"all-reduce, {p} ranks")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
