#!/usr/bin/env python3
"""Table and plot for scripts/lab_tasks.sh.

usage: lab_tasks_report.py OUT_DIR

Reads OUT_DIR/accuracy.csv (seed, the pre-training seed of its base model, held-out accuracy
after each stage) and OUT_DIR/rl_<seed>.csv (the trainer's --metrics: per RL step the mean
reward, the sample accuracy, the mean length, the KL, and the held-out accuracy where an
evaluation ran). Prints a markdown table of the mean and spread (sample standard deviation,
and min..max) per stage, says whether each stage beat the one before (and its control) by more
than the spread, and the gains seed by seed, and writes OUT_DIR/results.md and, when matplotlib
is importable, OUT_DIR/rl_curves.png (otherwise a note: the CSV files hold the same numbers).
"""
import csv
import os
import statistics
import sys

STAGES = [("pretrain", "pre-train"), ("pretrain_more", "pre-train more (control)"), ("sft", "SFT"),
          ("sft_more", "SFT more (control)"), ("rlvr", "RLVR")]
# (earlier stage, later stage): each stage against the one it starts from and against its control
COMPARISONS = [("pretrain", "sft"), ("sft", "rlvr"), ("pretrain_more", "sft"), ("sft_more", "rlvr")]
SHORT = {"pretrain": "pre-train", "pretrain_more": "pre-train more", "sft": "SFT", "sft_more": "SFT more",
         "rlvr": "RLVR"}


def read_accuracy(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"{path}: no rows (did the lab finish?)")
    return rows


def summary(values):
    mean = statistics.mean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, sd, min(values), max(values)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    rows = read_accuracy(os.path.join(out, "accuracy.csv"))
    seeds = [r["seed"] for r in rows]
    bases = sorted({r.get("base_seed", r["seed"]) for r in rows})
    shared = len(bases) == 1 and len(rows) > 1
    lines = ["| stage | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | std | min..max |",
             "|---|" + "---|" * len(seeds) + "---|---|---|"]
    stats = {}
    for key, name in STAGES:
        if shared and key == "pretrain":
            name = f"pre-train (one base model, seed {bases[0]})"
        if shared and key == "pretrain_more":
            name = "pre-train more (control, one run from the base)"
        vals = [float(r[key]) for r in rows]
        stats[key] = summary(vals)
        mean, sd, lo, hi = stats[key]
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f}%" for v in vals) +
                     f" | {mean:.1f}% | {sd:.1f} | {lo:.1f}..{hi:.1f} |")
    verdicts, paired = [], []
    for a, b in COMPARISONS:
        gain = stats[b][0] - stats[a][0]
        spread = max(stats[a][1], stats[b][1])
        ok = gain > spread
        verdicts.append(f"- {SHORT[b]} vs {SHORT[a]}: {gain:+.1f} points, largest std {spread:.1f}: "
                        f"{'beats it by more than the spread' if ok else 'NOT more than the spread'}")
        # paired: the gain seed by seed (each seed's later stages start from that seed's earlier
        # ones, so a spread they share, such as pre-training's when it is seeded too, cancels out)
        gains = [float(r[b]) - float(r[a]) for r in rows]
        mean, sd, lo, hi = summary(gains)
        paired.append(f"- paired gain {SHORT[b]} - {SHORT[a]}: " + ", ".join(f"{g:+.1f}" for g in gains) +
                      f" (mean {mean:+.1f}, std {sd:.1f})")
    text = "\n".join(lines) + "\n\n" + "\n".join(verdicts) + "\n" + "\n".join(paired) + "\n"

    # the RL curves
    curves = {}
    for s in seeds:
        path = os.path.join(out, f"rl_{s}.csv")
        if os.path.exists(path):
            curves[s] = list(csv.DictReader(open(path)))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for s, rs in curves.items():
            steps = [int(r["step"]) for r in rs if r["reward"]]
            reward = [float(r["reward"]) for r in rs if r["reward"]]
            k = 5   # a running mean over 5 steps: one step's 256 samples are noisy
            smooth = [statistics.mean(reward[max(0, i - k + 1):i + 1]) for i in range(len(reward))]
            axes[0].plot(steps, smooth, label=f"seed {s}")
            hs = [(int(r["step"]), 100 * float(r["heldout_accuracy"])) for r in rs if r["heldout_accuracy"]]
            axes[1].plot([h[0] for h in hs], [h[1] for h in hs], marker="o", label=f"seed {s}")
        axes[0].set_title("mean reward of the rollouts (exact match; 5-step running mean)")
        axes[0].set_xlabel("RL step")
        axes[0].set_ylabel("reward = sample accuracy")
        axes[1].set_title("held-out exact-match accuracy (greedy)")
        axes[1].set_xlabel("RL step")
        axes[1].set_ylabel("accuracy %")
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        png = os.path.join(out, "rl_curves.png")
        fig.savefig(png, dpi=100)
        text += f"\nplot: {png}\n"
    except ImportError:
        text += ("\nno plot: matplotlib is not installed for this python (bash scripts/install_deps.sh --lab, or apt-get install python3-matplotlib);"
                 f" the curves are in {out}/rl_<seed>.csv (step, reward, accuracy, length, kl, loss, heldout_accuracy)\n")
    open(os.path.join(out, "results.md"), "w").write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
