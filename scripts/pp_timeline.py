#!/usr/bin/env python3
"""The measured pipeline timeline of one optimizer step, from a trainer's --trace file.

usage: pp_timeline.py TRACE.json OUT.png [--title T] [--step K] [--ranks R0,R1,...] [--optional]

Reads the Chrome trace events the trainer writes with --trace (llmc/trace.h: pid = rank,
tid = track). The pipeline's actions are the compute-track (tid 0) events named F<i>, B<i>,
W<i> (micro-batch i; a trailing ' or '' for chunks 1 and 2 of an interleaved stage,
llmc/parallel/pp.h); the other compute events (the blocks inside a backward, the AdamW update,
waits) are skipped. Track 3 holds the sends and receives.

One step: on every rank each step's actions begin with F0 (micro-batch 0 enters every stage
first), so the actions are cut into steps there. The default step is the last one that is
complete on every rank (the first step is warm-up); --step K picks step K (1-based, as the
trainer counts).

The picture (like Narayanan et al. 2021, Figure 4, the lecture's): one row per stage, time to
the right (ms from the step's first action), a box per action labelled with its micro-batch
(0-based, as the trainer and --pp-print number them): forward blue, backward green, ZB-H1's
weight passes (W) orange, an interleaved stage's second chunk in the lighter shade (third
lighter still); white is idle; the thin grey bars under a row are its sends and receives
(the time a rank spends in them, waiting for its partner included), dark grey the all-reduce
of the tied embedding's gradient between the first and last stage after the last backward
(drawn up to the end of the pipeline's last action).
One row per rank holding pipeline actions, rank = stage: right for a pp-only mesh. With dp or
tp too, --ranks lists the ranks of one pipeline, stage 0 first (mesh.h: tp fastest, then pp).

It prints the step's measured bubble: 1 - busy / (p x makespan), busy the sum of the action
times over the stages, the makespan from the first action's start to the last one's end on any
stage. (The trainer's "pp bubble | measured" times each stage from the start of its own list,
its first receive included, so the two differ a little.)

Needs matplotlib (bash scripts/install_deps.sh --lab). Without it: an error, or with --optional
a note and exit status 0 (the bubble is still printed).
"""
import argparse
import json
import re
import sys

ACTION = re.compile(r"^([FBW])(\d+)('*)$")
# (kind, chunk) -> colour: chunk 0 the full shade, chunk 1 lighter, chunk 2 lighter still
COLOURS = {
    "F": ["#3b6fc4", "#9dbbe9", "#d2e1f6"],
    "B": ["#3f9f3f", "#a3d99a", "#d5eed0"],
    "W": ["#f08c1e", "#f9c98f", "#fce5c8"],
}
COMM_GREY, EMBED_GREY = "#9a9a9a", "#444444"
NAMES = {"F": "forward (F)", "B": "backward (B)", "W": "backward, weight gradient (W)"}


def load(path):
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"pp_timeline: cannot read the trace {path}: {e}")
    actions, comms = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        pid, tid = e["pid"], e["tid"]
        start, end = e["ts"] / 1000.0, (e["ts"] + e["dur"]) / 1000.0   # ms
        if tid == 0:
            m = ACTION.match(e["name"])
            if m:
                actions.setdefault(pid, []).append((start, end, m.group(1), int(m.group(2)), len(m.group(3)), e["name"]))
        elif tid == 3:
            comms.setdefault(pid, []).append((start, end, e["name"]))
    for lst in list(actions.values()) + list(comms.values()):
        lst.sort()
    return actions, comms


def split_steps(acts):
    """A rank's actions cut into steps: each begins at an F0 of chunk 0."""
    steps = []
    for a in acts:
        if a[2] == "F" and a[3] == 0 and a[4] == 0:
            steps.append([])
        if steps:
            steps[-1].append(a)
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--title", default=None)
    ap.add_argument("--step", type=int, default=0, help="the step to draw, 1-based (default: the last complete one)")
    ap.add_argument("--ranks", default=None, help="comma-separated ranks of one pipeline, stage 0 first")
    ap.add_argument("--optional", action="store_true", help="without matplotlib: a note and exit status 0")
    args = ap.parse_args()

    actions, comms = load(args.trace)
    if not actions:
        sys.exit(f"pp_timeline: {args.trace} holds no pipeline actions (F0, B0, ...): was it a --pp run with --trace?")
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else sorted(actions)
    missing = [r for r in ranks if r not in actions]
    if missing:
        sys.exit(f"pp_timeline: no pipeline actions for rank(s) {missing} in {args.trace}")
    p = len(ranks)
    steps = {r: split_steps(actions[r]) for r in ranks}
    nsteps = min(len(s) for s in steps.values())
    # a step is complete when every rank has as many actions in it as in its first step
    complete = [k for k in range(nsteps) if all(len(steps[r][k]) == len(steps[r][0]) for r in ranks)]
    if args.step:
        if args.step - 1 not in complete:
            sys.exit(f"pp_timeline: step {args.step} is not a complete step of the trace "
                     f"(complete steps: {', '.join(str(k + 1) for k in complete)})")
        k = args.step - 1
    else:
        k = complete[-1]
    rows = [steps[r][k] for r in ranks]
    t0 = min(row[0][0] for row in rows)
    t1 = max(row[-1][1] for row in rows)
    span = t1 - t0
    busy = [sum(a[1] - a[0] for a in row) for row in rows]
    bubble = 1.0 - sum(busy) / (p * span)
    kinds = sorted({a[2] for row in rows for a in row}, key="FBW".index)
    chunks = 1 + max(a[4] for row in rows for a in row)
    m = 1 + max(a[3] for row in rows for a in row)
    print(f"pp_timeline: {args.trace}: step {k + 1} of {nsteps} ({len(complete)} complete), p {p}, m {m}, "
          f"chunks {chunks}, actions {'/'.join(kinds)}")
    for s, (r, row) in enumerate(zip(ranks, rows)):
        mean = {kd: [a[1] - a[0] for a in row if a[2] == kd] for kd in kinds}
        times = ", ".join(f"{kd} {sum(v) / len(v):.2f} ms" for kd, v in mean.items() if v)
        print(f"  stage {s} (rank {r}): busy {busy[s]:.2f} of {span:.2f} ms ({1 - busy[s] / span:.3f} idle), mean {times}")
    print(f"  measured bubble {bubble:.3f} (1 - busy {sum(busy):.2f} ms / (p {p} x makespan {span:.2f} ms))")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        note = "pp_timeline: matplotlib is not installed (bash scripts/install_deps.sh --lab): no picture"
        if args.optional:
            print(note + f", {args.out} not written")
            return 0
        sys.exit(note)

    row_h, comm_h, gap = 1.0, 0.14, 0.5
    has_embed = False
    pitch = row_h + comm_h + gap
    height = 1.7 + 0.75 * p   # inches: the title 0.7, the rows, the axis and the legend 1.0
    fig, ax = plt.subplots(figsize=(13, height))
    ax.set_facecolor("white")
    for s, (r, row) in enumerate(zip(ranks, rows)):
        y = (p - 1 - s) * pitch + comm_h + 0.05
        ax.add_patch(plt.Rectangle((0, y), span, row_h, facecolor="white", edgecolor="#bbbbbb", linewidth=0.6))
        for (a0, a1, kd, micro, chunk, _name) in row:
            w = a1 - a0
            ax.add_patch(plt.Rectangle((a0 - t0, y), w, row_h, facecolor=COLOURS[kd][min(chunk, 2)],
                                       edgecolor="black", linewidth=0.4))
            # the label when it fits: about 0.9 % of the step per character at this width
            if w > span * 0.009 * len(str(micro)):
                ax.text(a0 - t0 + w / 2, y + row_h / 2, str(micro), ha="center", va="center",
                        fontsize=8 if p <= 4 else 7, color="white" if chunk == 0 else "black")
        for (c0, c1, name) in comms.get(r, []):
            if c1 <= t0 or c0 >= t1:
                continue
            c0, c1 = max(c0, t0), min(c1, t1)
            embed = name.startswith("embedding")
            has_embed = has_embed or embed
            ax.add_patch(plt.Rectangle((c0 - t0, y - comm_h - 0.03), max(c1 - c0, span * 0.0015), comm_h,
                                       facecolor=EMBED_GREY if embed else COMM_GREY, edgecolor="none"))
    ax.set_xlim(-span * 0.005, span * 1.005)
    ax.set_ylim(-0.1, p * pitch - gap + 0.1)
    ax.set_yticks([(p - 1 - s) * pitch + comm_h + 0.05 + row_h / 2 for s in range(p)])
    labels = [f"stage {s}" + (f" (rank {r})" if r != s else "") for s, r in enumerate(ranks)]
    ax.set_yticklabels(labels)
    ax.set_xlabel("time in the step (ms)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    title = args.title or f"measured pipeline timeline, step {k + 1}"
    ax.set_title(f"{title}\np {p}, m {m}{f', {chunks} chunks per stage' if chunks > 1 else ''}: "
                 f"measured bubble {bubble:.3f} (1 - busy / (p x makespan)), makespan {span:.1f} ms", fontsize=10)
    handles = []
    for kd in kinds:
        for c in range(chunks):
            name = "backward, input gradient (B)" if kd == "B" and "W" in kinds else NAMES[kd]
            label = name + (f", chunk {c}" if chunks > 1 else "")
            handles.append(Patch(facecolor=COLOURS[kd][min(c, 2)], edgecolor="black", linewidth=0.4, label=label))
    handles.append(Patch(facecolor="white", edgecolor="#bbbbbb", label="idle"))
    handles.append(Patch(facecolor=COMM_GREY, label="send / receive"))
    if has_embed:
        handles.append(Patch(facecolor=EMBED_GREY, label="tied embedding all-reduce"))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.01), ncol=len(handles) if len(handles) <= 7 else 5,
               fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.09, right=0.98, top=1 - 0.7 / height, bottom=1.0 / height)
    fig.savefig(args.out, dpi=130)
    print(f"pp_timeline: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
