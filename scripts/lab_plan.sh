#!/usr/bin/env bash
# Lab: the planner against the trainer's clock (doc/choosing-a-strategy.md, sections 4 and 6b).
#   Part 1: calibration. One rank of the small model, 1 thread: its "average step ... GFLOP/s"
#           becomes the planner's --peak-tflops (GFLOP/s / 1000) with --efficiency 1, on
#           --machine cpu (the ranks share the cores: each gets cores/ranks of that peak).
#   Part 2: six meshes on 4 CPU ranks (dp 4; dp 2 x tp 2; tp 4; pp 2 x dp 2, 1f1b, m 2;
#           dp 2 x cp 2; dp 4 ZeRO-3): the planner's predicted step (`--plan this`, its row)
#           beside the measured average step of 10 steps, and whether the predicted memory and
#           bytes of every rank equal what the run measured (--plan-check, as test_planner.sh).
#   Part 3: the lecture's hands-on: tp = 1, 2, 4 on the 4 ranks (dp = 4 / tp): memory per rank
#           and step time, predicted and measured (the runs of part 2).
# Memory and bytes are exact; the times are not (2 shared cores, 4 ranks oversubscribed on them,
# MPI's shared-memory transport modelled by the default 30 us + 2 GB/s): the error column mixes
# what the time model leaves out (ranks waiting for a core inside tp's and cp's collectives) with
# whatever else runs on the machine (the load average is printed before and after). Each run is
# done once.
# About a minute on 2 CPU cores. Tables go to stdout and to $OUT/lab_plan.md.
# Knobs (environment): BIN (./train_gpt2cpu), STEPS (10), MODEL, OUT (build/lab-plan).
#   bash scripts/lab_plan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_gpt2cpu}
STEPS=${STEPS:-10}
MODEL=${MODEL:-"--layers 8 --heads 4 --channels 128 --batch 8 --seq 64"}
OUT=${OUT:-build/lab-plan}
mkdir -p "$OUT"
[ -x "$BIN" ] || make "$(basename "$BIN")"
command -v mpirun >/dev/null || { echo "lab_plan: needs mpirun (apt-get install libopenmpi-dev openmpi-bin; make)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 300 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
REPORT="$OUT/lab_plan.md"

[ -f "$OUT/data/tokenizer.bin" ] ||
    python3 dev/data/arithmetic.py --out-dir "$OUT/data" --num-train 2000 --num-val 200 >/dev/null
D="--train-data $OUT/data/train_*.bin --val-data $OUT/data/val_*.bin --tokenizer $OUT/data/tokenizer.bin"
QUIET="--eval-every 0 --accuracy 0 --sample-every 0 --threads 1"

load() { cut -d' ' -f1-3 /proc/loadavg; }
# the run's own communication lines (rank 0, the last step): dp's exposed part, tp, pp, cp
measured_comm() {
    { grep '^     comm | sent' "$OUT/$1.out" | tail -1 | sed -n 's/.*ms, exposed \([0-9.]*\) ms.*/dp \1 exposed/p'
      grep '^  tp comm | sent' "$OUT/$1.out" | tail -1 | sed -n 's/.*collectives, \([0-9.]*\) ms.*/tp \1/p'
      grep '^  pp comm | sent' "$OUT/$1.out" | tail -1 | sed -n 's/.*| \([0-9.]*\) ms | check.*/pp \1/p'
      grep '^  cp comm | sent' "$OUT/$1.out" | tail -1 | sed -n 's/.*calls, \([0-9.]*\) ms not hidden.*/cp \1 not hidden/p'
    } | paste -sd, - | sed 's/,/, /g'
}
avg_ms() { sed -n 's/^average step (excluding the first): \([0-9.]*\) ms.*/\1/p' "$OUT/$1.out"; }
# the planner's row (--plan this): compute, bubble, exposed comm and step, ms
row() { awk '/^  1  dp/ { sub(/ +(fits|too big)$/, ""); print $(NF-3), $(NF-2), $(NF-1), $NF }' "$OUT/$1.plan"; }
# MiB of a "rank R: params N grads N ..." line: P+G, master+optim, acts, total, tp bytes
mib() {
    grep "^rank $2:" "$1" | tr -d '|' | awk '{ for (i = 3; i < NF; i += 2) v[$i] = $(i + 1);
        m = 1048576; printf "%.2f %.2f %.2f %.2f %.2f", (v["params"] + v["grads"]) / m, (v["master"] + v["optim"]) / m, v["acts"] / m,
        (v["params"] + v["grads"] + v["master"] + v["optim"] + v["acts"] + v["experts"]) / m, v["tp"] / m }'
}

# ---- Part 1: calibration
# shellcheck disable=SC2086
"$BIN" $D $MODEL $QUIET --steps "$STEPS" >"$OUT/calibrate.out" 2>&1 ||
    { echo "lab_plan: the calibration run failed:"; tail -5 "$OUT/calibrate.out"; exit 1; }
GFLOPS=$(sed -n 's/^average step.*| \([0-9.]*\) GFLOP\/s.*/\1/p' "$OUT/calibrate.out")
PEAK=$(awk -v g="$GFLOPS" 'BEGIN { printf "%.5f", g / 1000 }')
PLAN="--machine cpu --peak-tflops $PEAK --efficiency 1"
{
echo "## Part 1: calibration ($BIN $MODEL, 1 rank, 1 thread, $STEPS steps)"
echo
echo "load average before: $(load) (1, 5, 15 minutes; other work on the machine slows every run)"
echo "one rank: average step $(avg_ms calibrate) ms, $GFLOPS GFLOP/s -> planner flags: $PLAN"
echo "($(nproc) cores for 4 ranks: the planner gives each rank $PEAK TFLOP/s x min(1, $(nproc)/4) = $(awk -v p="$PEAK" -v c="$(nproc)" 'BEGIN { printf "%.5f", p * (c < 4 ? c / 4 : 1) }') TFLOP/s)"
echo
echo "## Part 2: predicted against measured, 4 ranks, $STEPS steps each (the average excludes the first)"
echo
echo "| mesh | predicted compute + bubble + comm (ms) | predicted step ms | measured step ms | error | measured comm ms (rank 0, last step) | memory and bytes, every rank |"
echo "|---|---:|---:|---:|---:|---|---|"
} | tee "$REPORT"

# mesh NAME FLAGS...: --plan this, then the run on 4 ranks with --plan-check
mesh() {
    local name=$1; shift
    # shellcheck disable=SC2086
    "$BIN" $D $MODEL $QUIET $PLAN "$@" --plan this >"$OUT/$name.plan" 2>&1 ||
        { echo "lab_plan: --plan this for $name failed:"; tail -3 "$OUT/$name.plan"; exit 1; }
    grep '^rank ' "$OUT/$name.plan" >"$OUT/$name.predicted"
    # shellcheck disable=SC2086
    $MPIRUN -np 4 "$BIN" $D $MODEL $QUIET --steps "$STEPS" "$@" --plan-check "$OUT/$name.measured" >"$OUT/$name.out" 2>&1 ||
        { echo "lab_plan: run $name failed:"; tail -5 "$OUT/$name.out"; exit 1; }
    local r meas same
    read -r -a r <<<"$(row "$name")"
    meas=$(avg_ms "$name")
    same=$(cmp -s "$OUT/$name.predicted" "$OUT/$name.measured" && echo "predicted = measured" || echo "DIFFER")
    echo "| \`$*\` | ${r[0]} + ${r[1]} + ${r[2]} | ${r[3]} | $meas | $(awk -v p="${r[3]}" -v m="$meas" 'BEGIN { printf "%+.0f%%", 100 * (p / m - 1) }') | $(measured_comm "$name") | $same |" |
        tee -a "$REPORT"
}
mesh dp4      --dp 4
mesh dp2-tp2  --dp 2 --tp 2
mesh tp4      --dp 1 --tp 4
mesh pp2-dp2  --dp 2 --pp 2 --pp-schedule 1f1b --grad-accum 2
mesh dp2-cp2  --dp 2 --cp 2
mesh dp4-z3   --dp 4 --zero 3

# ---- Part 3: tp = 1, 2, 4 (the runs above)
{
echo
echo "## Part 3: tp = 1, 2, 4 on 4 ranks (dp = 4 / tp): memory per rank (MiB, rank 0) and step time"
echo
echo "| tp | dp | P+G | master + m, v | activations | total predicted | total measured | tp MiB sent / step | predicted step ms | measured step ms |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} | tee -a "$REPORT"
for name in dp4 dp2-tp2 tp4; do
    case $name in dp4) tp=1 dp=4 ;; dp2-tp2) tp=2 dp=2 ;; tp4) tp=4 dp=1 ;; esac
    read -r -a p <<<"$(mib "$OUT/$name.predicted" 0)"
    read -r -a m <<<"$(mib "$OUT/$name.measured" 0)"
    read -r -a r <<<"$(row "$name")"
    echo "| $tp | $dp | ${p[0]} | ${p[1]} | ${p[2]} | ${p[3]} | ${m[3]} | ${p[4]} | ${r[3]} | $(avg_ms "$name") |" | tee -a "$REPORT"
done
echo
echo "load average after: $(load)" | tee -a "$REPORT"
echo "lab_plan: tables in $REPORT, every run's output in $OUT/"
