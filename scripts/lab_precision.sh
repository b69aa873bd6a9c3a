#!/usr/bin/env bash
# Lab: number formats and memory (doc/precision.md, doc/memory.md).
#   1. the default job (tiny GPT-2 on arithmetic) in each format, on the CPU backend, which stores
#      every parameter, activation and gradient rounded to it (--precision) and accumulates in
#      fp32, as a GPU does:
#        fp32 | bf16 | fp16 without loss scaling | fp16 with dynamic loss scaling |
#        fp8 (bf16 storage, the blocks' linears in E4M3/E5M2: --fp8 current)
#      -> one plot of the training-loss curves, a table of the final validation loss, held-out
#         accuracy, step time, gradient values flushed to zero (the fp16 underflow loss scaling
#         cures) and steps skipped for overflow;
#   2. activation memory for --recompute none | selective | full: measured beside the formula,
#      and the step time (the price of recomputation);
#   3. ZeRO-3 and ZeRO++ (--qwz, --hpz, --qgz) on 4 ranks: the bytes each rank sends per step
#      beside the formula, memory, and the loss after a few steps.
# About 10 minutes on 2 CPU cores. Knobs (environment): STEPS (part 1's steps, default 900: the
# whole default job, which learns the task in fp32 by then; doc/training-tasks.md),
# EXAMPLES (held-out examples), PARTS (default "1 2 3"), THREADS, OUT.
#   bash scripts/lab_precision.sh
#   STEPS=200 PARTS=1 bash scripts/lab_precision.sh      # a quick look at part 1
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-900}
EXAMPLES=${EXAMPLES:-500}
PARTS=${PARTS:-"1 2 3"}
THREADS=${THREADS:-0}
OUT=${OUT:-build/lab_precision}
mkdir -p "$OUT"
make -s train_gpt2cpu data >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"

part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# ---- 1. the formats
if part 1; then
    echo "== 1. the default job ($STEPS steps) in each format"
    : >"$OUT/formats.txt"
    run() {   # NAME LABEL FLAGS...: one run, its --log and output kept
        local name=$1 label=$2
        shift 2
        local t0=$SECONDS
        ./train_gpt2cpu --steps "$STEPS" --eval-every 0 --sample-every 0 --accuracy "$EXAMPLES" --threads "$THREADS" \
            --log "$OUT/$name.log" "$@" >"$OUT/$name.out" 2>&1 || { echo "   $label: the run failed, see $OUT/$name.out"; return 0; }
        echo "$name|$label|$*|$((SECONDS - t0))" >>"$OUT/formats.txt"
        echo "   $label ($*): $(grep -o 'val loss .*' "$OUT/$name.out" | tail -1), $((SECONDS - t0)) s"
    }
    run fp32 "fp32"
    run bf16 "bf16" --precision bf16
    run fp16 "fp16, no loss scaling" --precision fp16
    run fp16_scaled "fp16, dynamic loss scaling" --precision fp16 --loss-scale dynamic
    run fp8 "fp8 (E4M3/E5M2 linears, bf16 storage)" --precision bf16 --fp8 current
fi

# ---- 2. recomputation
if part 2; then
    echo "== 2. activation memory and time for each --recompute mode (the default model, 20 steps)"
    for mode in none selective full; do
        ./train_gpt2cpu --steps 20 --eval-every 0 --sample-every 0 --accuracy 0 --threads "$THREADS" --recompute $mode \
            --log "$OUT/recompute_$mode.log" >"$OUT/recompute_$mode.out" 2>&1
        echo "   --recompute $mode: $(grep -m1 '^activations' "$OUT/recompute_$mode.out" || true)"
    done
    if cmp -s "$OUT/recompute_none.log" "$OUT/recompute_selective.log" && cmp -s "$OUT/recompute_none.log" "$OUT/recompute_full.log"; then
        echo "   the three --log files are identical (recomputation changes no bit)"
    else
        echo "   WARNING: the --log files differ"
    fi
fi

# ---- 3. ZeRO++
if part 3; then
    echo "== 3. ZeRO-3 and ZeRO++ on 4 ranks (the default model, 20 steps)"
    for opt in "zero3|" "qwz|--qwz" "hpz|--hpz 2" "qgz8|--qgz 8" "qgz4|--qgz 4" "all|--qwz --hpz 2 --qgz 4"; do
        name=${opt%%|*}
        flags=${opt#*|}
        # shellcheck disable=SC2086
        $MPIRUN -np 4 ./train_gpt2cpu --zero 3 $flags --steps 20 --eval-every 0 --sample-every 0 --accuracy 0 --threads 1 \
            --log "$OUT/zeropp_$name.log" >"$OUT/zeropp_$name.out" 2>&1 || echo "   $name: the run failed, see $OUT/zeropp_$name.out"
        echo "   --zero 3 $flags: loss after 20 steps $(tail -1 "$OUT/zeropp_$name.log" | awk '{print $2}')"
    done
fi

# the report: a python3 that has matplotlib draws the plot (Debian's python3-matplotlib is in /usr/bin)
py=""
for cand in /usr/bin/python3 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import matplotlib" >/dev/null 2>&1; then py=$cand; break; fi
done
"${py:-python3}" scripts/lab_precision_report.py "$OUT" "$PARTS"
