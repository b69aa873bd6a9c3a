#!/usr/bin/env python3
"""Table and plot for scripts/lab_seeds.sh.

usage: lab_seeds_report.py OUT_DIR RECIPE...

Reads OUT_DIR/RECIPE/seed_<seed>.out (the trainer's output: a 'step N/M' line per step and a
'val loss X | accuracy Y%' line per evaluation, the first before step 1) for every recipe.
Prints, and writes to OUT_DIR/results.md: per seed the final held-out accuracy, the final
validation loss and the first evaluated step at 90% or more; then per recipe the spread (median,
quartiles, min, max, mean, how many seeds reach 90%, the largest final validation loss and the
largest rise of the training loss after the warm-up). Writes OUT_DIR/accuracy_by_step.png (one
panel per recipe, one line per seed) when matplotlib is importable.
"""
import glob
import os
import re
import statistics
import sys

STEP = re.compile(r"^step\s+(\d+)/(\d+) \| loss ([0-9.naif]+)")
EVAL = re.compile(r"^val loss ([0-9.naif]+) \| accuracy ([0-9.]+)%")
WARMUP = re.compile(r"--warmup (\d+)")


def read_run(path):
    """(evals [(step, val loss, accuracy %)], train losses {step: loss})."""
    evals, losses, step = [], {}, 0
    for line in open(path, errors="replace"):
        m = STEP.match(line)
        if m:
            step = int(m.group(1))
            losses[step] = float(m.group(3))
            continue
        m = EVAL.match(line)
        if m:
            evals.append((step, float(m.group(1)), float(m.group(2))))
    return evals, losses


def first_at(evals, level=90.0):
    for step, _, acc in evals:
        if acc >= level:
            return step
    return None


def learned_from(evals, level=50.0):
    """The first evaluated step at `level`% or more (None: never): from there on the model has
    something a loss spike could undo."""
    return first_at(evals, level)


def drop_after_90(evals):
    """The largest fall of the held-out accuracy between two evaluations after the first at 90%."""
    f = first_at(evals)
    if f is None:
        return 0.0
    accs = [a for s, _, a in evals if s >= f]
    return max([0.0] + [accs[i] - accs[j] for i in range(len(accs)) for j in range(i + 1, len(accs))])


def spike(losses, after):
    """The largest rise of the training loss over its running minimum after step `after`,
    smoothed over 10 steps (a spike that undoes learning shows as a rise of tenths)."""
    steps = sorted(s for s in losses if s > after)
    if len(steps) < 20:
        return 0.0
    smooth = [statistics.fmean(losses[s] for s in steps[i:i + 10]) for i in range(len(steps) - 9)]
    best, worst = smooth[0], 0.0
    for v in smooth:
        best = min(best, v)
        worst = max(worst, v - best)
    return worst


def quartiles(xs):
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def seed_key(path):
    s = os.path.basename(path)[len("seed_"):-len(".out")]
    return (0, int(s)) if s == "1337" else (1, int(s) if s.isdigit() else 0)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, recipes = sys.argv[1], sys.argv[2:]
    runs = {}
    for r in recipes:
        runs[r] = {}
        for path in sorted(glob.glob(os.path.join(out, r, "seed_*.out")), key=seed_key):
            evals, losses = read_run(path)
            if evals:
                seed = os.path.basename(path)[len("seed_"):-len(".out")]
                runs[r][seed] = (evals, losses)
    lines = ["# lab_seeds: held-out accuracy of the default job per seed", ""]
    seeds = []
    for r in recipes:
        for s in runs[r]:
            if s not in seeds:
                seeds.append(s)
    head = "| seed |" + "".join(f" {r}: final | {r}: val loss | {r}: first step at 90% |" for r in recipes)
    lines += [head, "|---|" + "---|---|---|" * len(recipes)]
    for s in seeds:
        row = f"| {s} |"
        for r in recipes:
            if s not in runs[r]:
                row += " | | |"
                continue
            evals, _ = runs[r][s]
            f = first_at(evals)
            row += f" {evals[-1][2]:.1f}% | {evals[-1][1]:.4f} | {f if f is not None else 'never'} |"
        lines.append(row)
    lines += ["", "| recipe | seeds | median (quartiles) | min .. max | mean | at 90% or more | "
              "median first step at 90% | largest final val loss | largest loss rise after warm-up | "
              "the same once at 50% | largest accuracy fall after 90% |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in recipes:
        if not runs[r]:
            continue
        finals = [e[-1][2] for e, _ in runs[r].values()]
        vals = [e[-1][1] for e, _ in runs[r].values()]
        firsts = [first_at(e) for e, _ in runs[r].values()]
        reached = [f for f in firsts if f is not None]
        warm = 50
        any_log = next(iter(glob.glob(os.path.join(out, r, "seed_*.out"))), None)
        rises = [spike(l, warm) for _, l in runs[r].values()]
        rises_learned = [spike(l, learned_from(e)) for e, l in runs[r].values() if learned_from(e) is not None]
        drops = [drop_after_90(e) for e, _ in runs[r].values()]
        q1, q3 = quartiles(finals)
        lines.append(f"| {r} | {len(finals)} | {statistics.median(finals):.1f}% ({q1:.1f}, {q3:.1f}) | "
                     f"{min(finals):.1f} .. {max(finals):.1f}% | {statistics.fmean(finals):.1f}% | "
                     f"{sum(x >= 90 for x in finals)} of {len(finals)} | "
                     f"{statistics.median(reached) if reached else 'never'} | {max(vals):.4f} | {max(rises):.3f} | "
                     f"{max(rises_learned) if rises_learned else 0:.3f} | {max(drops):.1f} |")
        del any_log
    lines += ["", "(accuracy: exact match on the held-out sums; first step at 90%: the first evaluation at "
              "90% or more; loss rise: the largest rise of the 10-step mean training loss above its lowest "
              "value so far, after step 50 (the warm-up), and after the first evaluation at 50% or more, "
              "when there is something learned to undo; accuracy fall: between any two evaluations after "
              "the first at 90%, in points)"]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        shown = [r for r in recipes if runs[r]]
        fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4.2), squeeze=False)
        for ax, r in zip(axes[0], shown):
            for s, (evals, _) in runs[r].items():
                ax.plot([e[0] for e in evals], [e[2] for e in evals], lw=1.6 if s == "1337" else 0.8,
                        color="black" if s == "1337" else None, alpha=1.0 if s == "1337" else 0.7,
                        label="seed 1337 (default)" if s == "1337" else None)
            ax.axhline(90, color="grey", ls="--", lw=0.8)
            ax.set_title(f"{r}: {len(runs[r])} seeds")
            ax.set_xlabel("step")
            ax.set_ylabel("held-out accuracy (%)")
            ax.set_ylim(0, 100)
            ax.legend(loc="lower right")
        fig.tight_layout()
        png = os.path.join(out, "accuracy_by_step.png")
        fig.savefig(png, dpi=110)
        lines += ["", f"plot: {png}"]
    except ImportError:
        lines += ["", "(matplotlib is not importable: no plot; the seed_*.out files hold the curves)"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
