#!/usr/bin/env python3
"""Tables and plot for scripts/lab_precision.sh.

usage: lab_precision_report.py OUT_DIR [PARTS]

Part 1 reads OUT_DIR/formats.txt (name|label|flags|seconds per run) and each run's NAME.log
(step loss norm lr) and NAME.out (the trainer's output: final validation loss and accuracy,
average step time, the rounding summary, the loss-scale column). Parts 2 and 3 read the
recomputation and ZeRO++ runs' outputs. Writes OUT_DIR/results.md (the tables) and, when
matplotlib is importable, OUT_DIR/precision_curves.png (training loss of every format, a
moving average over 25 steps, and the raw fp16-without-scaling curve against fp32).
"""
import os
import re
import sys

out_dir = sys.argv[1]
parts = (sys.argv[2] if len(sys.argv) > 2 else "1 2 3").split()
lines = []


def read(path):
    return open(path).read() if os.path.exists(path) else ""


def grab(pattern, text, group=1, last=True):
    found = re.findall(pattern, text)
    if not found:
        return None
    hit = found[-1] if last else found[0]
    return hit if isinstance(hit, str) else hit[group - 1]


def read_log(path):
    rows = []
    for line in read(path).splitlines():
        f = line.split()
        if len(f) >= 2:
            rows.append((int(f[0]), float(f[1])))
    return rows


def moving_average(values, n):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= n:
            acc -= values[i - n]
        out.append(acc / min(i + 1, n))
    return out


if "1" in parts and os.path.exists(os.path.join(out_dir, "formats.txt")):
    runs = [l.split("|") for l in read(os.path.join(out_dir, "formats.txt")).splitlines() if l.strip()]
    lines += ["## 1. The default job in each format", "",
              "| format | flags | final train loss (mean of last 50 steps) | val loss | held-out accuracy | "
              "ms/step | gradient values flushed to 0 | steps skipped (overflow) |",
              "|---|---|---|---|---|---|---|---|"]
    curves = []
    for name, label, flags, seconds in runs:
        text = read(os.path.join(out_dir, name + ".out"))
        log = read_log(os.path.join(out_dir, name + ".log"))
        tail = [l for _, l in log[-50:] if l == l]
        train = f"{sum(tail) / len(tail):.4f}" if tail else "n/a"
        val = grab(r"val loss ([0-9.na]+) \| accuracy", text) or "n/a"
        acc = grab(r"accuracy ([0-9.]+)% \(exact match", text)
        ms = grab(r"average step \(excluding the first\): ([0-9.]+) ms", text) or "n/a"
        flushed = grab(r"rounding, gradients +([0-9.]+)% of", text)
        skipped = grab(r"\((\d+) skipped\) \|", text)
        lines.append(f"| {label} | `{flags or '(default)'}` | {train} | {val} | {acc + '%' if acc else 'n/a'} | {ms} | "
                     f"{flushed + '%' if flushed else '0 (fp32 storage)' if 'precision' not in flags else 'n/a'} | "
                     f"{skipped if skipped else '0' if 'loss-scale' in flags else '-'} |")
        curves.append((label, log))
    lines.append("")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        for label, log in curves:
            steps = [s for s, _ in log]
            losses = [l for _, l in log]
            axes[0].plot(steps, moving_average(losses, 25), label=label, linewidth=1.2)
        axes[0].set_yscale("log")
        axes[0].set_xlabel("step")
        axes[0].set_ylabel("training loss (moving average, 25 steps)")
        axes[0].set_title("the default job in each number format")
        axes[0].legend()
        axes[0].grid(alpha=0.3)
        for label, log in curves:   # the late phase, linear scale: where the formats differ
            n = len(log)
            part = log[n // 3:]
            axes[1].plot([s for s, _ in part], moving_average([l for _, l in part], 25), label=label, linewidth=1.2)
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("training loss (moving average, 25 steps)")
        axes[1].set_title("the last two thirds, linear scale")
        axes[1].grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "precision_curves.png"), dpi=110)
        lines += [f"plot: {os.path.join(out_dir, 'precision_curves.png')}", ""]
    except ImportError:
        lines += ["(matplotlib is not importable: no plot; the .log files hold the curves; "
                  "bash scripts/install_deps.sh --lab installs it)", ""]

if "2" in parts:
    lines += ["## 2. Activation recomputation (the default model, 20 steps)", "",
              "| --recompute | activations, measured | formula | kept per layer | scratch (one block) | ms/step | overhead |",
              "|---|---|---|---|---|---|---|"]
    base = None
    for mode in ("none", "selective", "full"):
        text = read(os.path.join(out_dir, f"recompute_{mode}.out"))
        m = re.search(r"recompute \w+: ([0-9.]+) MiB measured = ([0-9.]+) MiB formula .*? x ([0-9.]+) MiB kept .*?\+ ([0-9.]+) MiB scratch",
                      text)
        ms = grab(r"average step \(excluding the first\): ([0-9.]+) ms", text)
        if mode == "none" and ms:
            base = float(ms)
        over = f"+{100 * (float(ms) / base - 1):.0f}%" if ms and base and mode != "none" else "-"
        if m:
            lines.append(f"| {mode} | {m.group(1)} MiB | {m.group(2)} MiB | {m.group(3)} MiB | {m.group(4)} MiB | {ms or 'n/a'} | {over} |")
        else:
            lines.append(f"| {mode} | n/a | n/a | n/a | n/a | {ms or 'n/a'} | {over} |")
    lines.append("")

if "3" in parts:
    lines += ["## 3. ZeRO-3 and ZeRO++ on 4 ranks (the default model, 20 steps)", "",
              "| flags | loss after 20 steps | sent per step by rank 0 | = formula | ZeRO++ collectives (bytes, each = formula) | "
              "parameters per rank | ms/step |", "|---|---|---|---|---|---|---|"]
    for name, flags in (("zero3", ""), ("qwz", "--qwz"), ("hpz", "--hpz 2"), ("qgz8", "--qgz 8"), ("qgz4", "--qgz 4"),
                        ("all", "--qwz --hpz 2 --qgz 4")):
        text = read(os.path.join(out_dir, f"zeropp_{name}.out"))
        log = read_log(os.path.join(out_dir, f"zeropp_{name}.log"))
        loss = f"{log[-1][1]:.4f}" if log else "n/a"
        sent = re.findall(r"comm \| sent +([0-9.]+) MiB by this rank \(formula +([0-9.]+) MiB, (\w+)\)", text)
        coll = re.findall(r"(qwZ all-gather|hpZ group all-gather|qgZ all-to-all) sent (\d+) B \(formula (\d+) B, (\w+)\)",
                          grab(r"(?m)^ +zero\+\+ \| (.*)$", text) or "")
        per = ", ".join(f"{c[0]} {int(c[1]):,}" + ("" if c[3] == "equal" else " (DIFFERENT)") for c in coll) or "-"
        params = grab(r"(?m)^  parameters +([0-9.]+ MiB)", text) or "n/a"
        ms = grab(r"average step \(excluding the first\): ([0-9.]+) ms", text) or "n/a"
        lines.append(f"| `{('--zero 3 ' + flags).strip()}` | {loss} | {sent[-1][0] + ' MiB' if sent else 'n/a'} | "
                     f"{sent[-1][2] if sent else 'n/a'} | {per} | {params} | {ms} |")
    lines.append("")

report = "\n".join(lines)
open(os.path.join(out_dir, "results.md"), "w").write(report + "\n")
print(report)
