#!/usr/bin/env bash
# Lab: tensor and sequence parallelism, then ZeRO-3 + TP (doc/tensor-parallel.md).
#   Part 1: one model on tp = 1, 2, 4 ranks, without and with --sp: the parameters and
#           activations each rank holds, and the bytes each rank sends on the tp group per step,
#           measured beside the formulas of llmc/parallel/tp_accounting.h.
#   Part 2: the lecture's hands-on (FSDP + TP): the same world size split as dp x tp with
#           ZeRO-3 over dp: memory per rank (parameters + gradients + optimizer state, and
#           activations) and step time.
# Every run goes through scripts/launch.sh (it finds the machines, picks one rank per GPU or CPU
# ranks, prints its mpirun line). Tables go to stdout and to $OUT/lab_tp.md.
#
# The model is chosen so the split shows: 4 layers of C 512 (8 heads), sequences of 256 tokens,
# about 13M parameters, where the replicated part (layernorms, biases, wpe) is small beside the
# matrices and the activations dominate. About 5 minutes on 2 CPU cores (the runs above 2
# ranks share them: the step times there say little, the bytes and memory are exact).
# Knobs (environment): BIN (default ./train_gpt2cpu, or ./train_gpt2cu on a GPU), TPS ("1 2 4"),
# WORLD (4), STEPS (3), MODEL, OUT (build/lab-tp).
#   bash scripts/lab_tp.sh
#   BIN=./train_gpt2cu MODEL="--model gpt2 --batch 8 --seq 1024" bash scripts/lab_tp.sh   # on GPUs
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_gpt2cpu}
TPS=${TPS:-"1 2 4"}
WORLD=${WORLD:-4}
STEPS=${STEPS:-3}
MODEL=${MODEL:-"--layers 4 --heads 8 --channels 512 --max-seq 256 --batch 4 --seq 256"}
OUT=${OUT:-build/lab-tp}
mkdir -p "$OUT"
[ -x "$BIN" ] || make "$(basename "$BIN")"
COMMON="--bench --steps $STEPS --eval-every 0 --sample-every 0 --accuracy 0"
REPORT="$OUT/lab_tp.md"

# run NAME NP FLAGS...: the trainer through the launcher; its output in $OUT/NAME.out
run() {
    local name=$1 np=$2; shift 2
    # shellcheck disable=SC2086
    scripts/launch.sh --np "$np" -- "$BIN" $MODEL $COMMON "$@" >"$OUT/$name.out" 2>&1 ||
        { echo "lab_tp: run $name failed:"; tail -5 "$OUT/$name.out"; exit 1; }
}
# sent NAME KIND: the MiB this rank sent per step on the dp ("comm |") or tp ("tp comm |") group
sent() { { grep -m1 "^ *$2 | sent" "$OUT/$1.out" || true; } | sed -n 's/.*sent *\([0-9.]*\) MiB.*/\1/p'; }
avg_ms() { sed -n 's/^average step (excluding the first): \([0-9.]*\) ms.*/\1/p' "$OUT/$1.out"; }

{
echo "## Part 1: tensor and sequence parallelism ($BIN $MODEL)"
echo
echo "| tp | SP | parameters / rank | activations / rank (formula) | tp bytes / step / rank (formula) | step ms |"
echo "|---:|:--:|---:|---:|---:|---:|"
} | tee "$REPORT"
for tp in $TPS; do
    for sp in 0 1; do
        if [ "$tp" = 1 ] && [ "$sp" = 1 ]; then continue; fi
        name="tp$tp-sp$sp"
        flags=""
        [ "$tp" -gt 1 ] && flags="--tp $tp"
        [ "$sp" = 1 ] && flags="$flags --sp"
        # shellcheck disable=SC2086
        run "$name" "$tp" $flags
        params=$(sed -n 's/^model .*: \([0-9]*\) parameters\(, \([0-9]*\) in this rank.s shard\)\{0,1\}$/\1 \3/p' "$OUT/$name.out" | awk '{print $NF}')
        if [ "$tp" -gt 1 ]; then
            acts="$(grep -m1 'activations per rank' "$OUT/$name.out" | sed -n 's/.*rank *\([0-9.]*\) MiB *(formula *\([0-9.]*\) MiB.*/\1 MiB (\2 MiB)/p')"
            bytes="$(grep -m1 'tp comm | sent' "$OUT/$name.out" | sed -n 's/.*sent *\([0-9.]*\) MiB.*(formula *\([0-9.]*\) MiB.*/\1 MiB (\2 MiB)/p')"
        else
            acts="$(sed -n 's/.*activations \([0-9.]*\) MiB.*/\1/p' "$OUT/$name.out" | head -1) MiB (allocated)"
            bytes="0"
        fi
        echo "| $tp | $([ "$sp" = 1 ] && echo yes || echo no) | $params | $acts | $bytes | $(avg_ms "$name") |" | tee -a "$REPORT"
    done
done

{
echo
echo "## Part 2: ZeRO-3 + TP on $WORLD ranks (dp x tp, ZeRO-3 over dp, SP on with tp > 1)"
echo
echo "| dp x tp | micro-batch / rank | parameters | gradients | optimizer m, v | activations | total / rank | dp MiB / step | tp MiB / step | step ms |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} | tee -a "$REPORT"
for tp in $TPS; do
    [ $((WORLD % tp)) -eq 0 ] || continue
    dp=$((WORLD / tp))
    name="z3-dp$dp-tp$tp"
    flags="--zero 3"
    [ "$tp" -gt 1 ] && flags="$flags --tp $tp --sp"
    # shellcheck disable=SC2086
    run "$name" "$WORLD" $flags
    row=$(awk '/^  parameters/ {p=$2} /^  gradients/ {g=$2} /^  optimizer m, v/ {o=$4} /^  activations/ {a=$2}
               END {printf "%.2f MiB | %.2f MiB | %.2f MiB | %.2f MiB | %.2f MiB", p, g, o, a, p + g + o + a}' "$OUT/$name.out")
    micro=$(sed -n 's/.*(micro-batch \([0-9]*\),.*/\1/p' "$OUT/$name.out")
    tpsent=$(sent "$name" "tp comm"); tpsent=${tpsent:-0}
    echo "| $dp x $tp | $micro | $row | $(sent "$name" comm) | $tpsent | $(avg_ms "$name") |" | tee -a "$REPORT"
done
echo
echo "lab_tp: tables in $REPORT, every run's output in $OUT/"
