#!/usr/bin/env bash
# Lab: gradient compression (doc/parameter-server.md, section 3; llmc/parallel/dp_compress.h).
# The default job (tiny GPT-2 on arithmetic) on 2 CPU ranks (--threads 1), naive data
# parallelism (one all-reduce, or its compressed all-gather, per step), for no compression and
# each method at two compression ratios, with error feedback, and two without it:
#   none | topk:0.1 topk:0.01 | randk:0.1 randk:0.01 | qsgd:8 qsgd:2 | sign | topk:0.01 off, sign off
# Records the final train loss, val loss, held-out accuracy (--accuracy) and the bytes rank 0
# sent per step (counted, = the formula); writes $OUT/compress.md (a markdown table) and the
# training-loss curves as doc/ps-compression.png (PLOT=... elsewhere).
# Knobs (environment): STEPS (default 600 of the default job's 1600), EXAMPLES (held-out
# examples, default 300), OUT, PLOT, REPORT_ONLY=1 (the table and plot again from $OUT's runs).
# About 0.3 s a step per run on 2 shared cores: 10 runs x 600 steps ~ 30 minutes; STEPS=200 ~ 10.
#   bash scripts/lab_ps_compress.sh
#   STEPS=200 bash scripts/lab_ps_compress.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-600}
EXAMPLES=${EXAMPLES:-300}
OUT=${OUT:-build/lab_ps_compress}
PLOT=${PLOT:-doc/ps-compression.png}
mkdir -p "$OUT"
make -s train_gpt2cpu data >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
RUNS=("none|"
      "topk:0.1|--compress topk:0.1"
      "topk:0.01|--compress topk:0.01"
      "randk:0.1|--compress randk:0.1"
      "randk:0.01|--compress randk:0.01"
      "qsgd:8|--compress qsgd:8"
      "qsgd:2|--compress qsgd:2"
      "sign|--compress sign"
      "topk:0.01 no EF|--compress topk:0.01 --error-feedback off"
      "sign no EF|--compress sign --error-feedback off")
: "${REPORT_ONLY:=0}"
[ "$REPORT_ONLY" = 1 ] || : >"$OUT/runs.txt"
for entry in "${RUNS[@]}"; do
    [ "$REPORT_ONLY" = 1 ] && break
    label=${entry%%|*}
    flags=${entry#*|}
    tag=$(echo "$label" | tr ' :.' '___')
    echo "== $label ($STEPS steps)"
    # shellcheck disable=SC2086
    $MPIRUN -np 2 ./train_gpt2cpu --dp-mode naive --threads 1 --steps "$STEPS" --eval-every 0 --sample-every 0 \
        --accuracy "$EXAMPLES" $flags --log "$OUT/$tag.log" >"$OUT/$tag.out" 2>&1 || { echo "run $label failed"; tail -3 "$OUT/$tag.out"; exit 1; }
    echo "$label|$tag" >>"$OUT/runs.txt"
    grep -m1 "val loss" "$OUT/$tag.out" || true
done

/usr/bin/python3 - "$OUT" "$PLOT" "$STEPS" <<'EOF'
import re, sys
out, plot, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows, curves = [], {}
for line in open(f"{out}/runs.txt"):
    label, tag = line.strip().split("|")
    text = open(f"{out}/{tag}.out").read()
    log = [l.split() for l in open(f"{out}/{tag}.log") if l.strip()]
    loss = [float(l[1]) for l in log]
    curves[label] = loss
    m = re.search(r"val loss ([0-9.]+) \| accuracy ([0-9.]+)%", text)
    # bytes per step: the formula, which every step's counted bytes equal ("equal" on the comm line)
    equal = len(re.findall(r"comm \| sent .* equal\)", text)) == steps
    f = re.search(r"this rank sends ([0-9]+) B per step \(formula\), uncompressed ([0-9]+) B", text)
    sent = int(f.group(1)) if f else None
    ms = re.search(r"average step \(excluding the first\): ([0-9.]+) ms", text)
    comm = re.search(r"communication per step \(rank 0\): ([0-9.]+) ms", text)
    tail = loss[-50:]
    rows.append((label, sum(tail) / len(tail), float(m.group(1)), float(m.group(2)), sent if f else 0, equal, int(f.group(2)) if f else None,
                 float(ms.group(1)), float(comm.group(1))))
base = next(r[6] for r in rows if r[6])   # the uncompressed ring all-reduce's bytes
rows = [(r[0], r[1], r[2], r[3], r[4] or base, r[5], r[7], r[8]) for r in rows]
with open(f"{out}/compress.md", "w") as f:
    f.write(f"| method (2 ranks, naive, {steps} steps) | train loss (mean of last 50) | val loss | accuracy | bytes sent per step (rank 0, formula) | counted = formula every step | vs none | step ms | comm ms |\n")
    f.write("|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r[0]} | {r[1]:.4f} | {r[2]:.4f} | {r[3]:.1f}% | {r[4]:,} | {'yes' if r[5] else 'NO'} | {r[4] / base:.4f} | {r[6]:.1f} | {r[7]:.1f} |\n")
print(open(f"{out}/compress.md").read())
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(9, 5.5))
def smooth(y, w=20):
    return [sum(y[max(0, i - w + 1):i + 1]) / (i + 1 - max(0, i - w + 1)) for i in range(len(y))]
for label, y in curves.items():
    ax.plot(range(1, len(y) + 1), smooth(y), label=label, lw=2.0 if label == "none" else 1.2,
            ls="--" if "no EF" in label else "-")
ax.set_xlabel("step")
ax.set_ylabel("train loss (moving mean of 20 steps)")
ax.set_title(f"Gradient compression: the default job on 2 ranks, {steps} steps")
ax.set_yscale("log")
ax.legend(ncol=2, fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(plot, dpi=110)
print("wrote", plot)
EOF
