#!/usr/bin/env bash
# Lab: run-to-run variance. The default job (`make train`) once per seed, PAR runs side by side
# (one thread each: the results do not depend on the thread count), the held-out accuracy every
# EVAL_EVERY steps, then a table (per seed: the final accuracy and validation loss, and the first
# step at 90% or more; the spread over the seeds) and a plot of accuracy against step for every
# seed (matplotlib if python3 has it, otherwise the logs and a note).
#
# RECIPES names what is run: "after" is today's default job (the trainer's defaults on the
# default data); "before" is the recipe of the default job up to issue 57 (doc/training-tasks.md,
# "A default job that learns on every seed"): the plain format `64+3=67` packed into rows of 64
# tokens, GPT-2's initialisation (std 0.02), 1600 steps. Both are plain flags of today's trainer
# and data generator, so one checkout runs both.
#
# Why many seeds: one run proves little. The seed draws the initial weights; at this scale when,
# and whether, a run finds the addition table can hang on it (the before recipe ends anywhere
# from 9% to 88%), so a recipe is judged by its spread, not by one lucky (or unlucky) run.
#
# Time (2 Zen 5 cores, one run per core, at 2026-12-02's step time: about 200 ms a step on one
# thread): the after recipe about 3.5 minutes a run, the before recipe about 5.5; 27 seeds about
# 45 and 75 minutes. Knobs (environment):
#   SEEDS        seeds (default: 1337 and 1-26, 27 runs)
#   RECIPES      "after", "before" or "after before" (default "after")
#   PAR          runs at a time (default: the number of cores)
#   EVAL_EVERY   steps between held-out evaluations (default 50 after, 100 before)
#   EXAMPLES     held-out examples per evaluation (default 500, the default job's)
#   OUT          output folder (default build/lab_seeds)
#   NICE         run the trainers under `nice -n NICE` (default 0)
#   EXTRA        more trainer flags for every run (e.g. "--steps 300" for a quick look)
#   bash scripts/lab_seeds.sh                                   # the 27 seeds, today's recipe
#   SEEDS="1337 1 2 3" RECIPES="after before" bash scripts/lab_seeds.sh   # a quick comparison
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"1337 $(seq -s ' ' 1 26)"}
RECIPES=${RECIPES:-after}
PAR=${PAR:-$(nproc 2>/dev/null || echo 2)}
EXAMPLES=${EXAMPLES:-500}
OUT=${OUT:-build/lab_seeds}
NICE=${NICE:-0}
EXTRA=${EXTRA:-}
mkdir -p "$OUT"
make -s train_gpt2cpu data >/dev/null

# the flags of each recipe (the data pattern, then the trainer's flags)
recipe_flags() {
    case "$1" in
        after)
            echo "--eval-every ${EVAL_EVERY:-50}" ;;
        before)
            # the plain format, written once into its own folder
            if [ ! -f "$OUT/data-plain/val_000000.bin" ]; then
                python3 dev/data/arithmetic.py --format plain --num-sft-train 0 --num-sft-val 0 \
                    --out-dir "$OUT/data-plain" >/dev/null
            fi
            echo "--train-data $OUT/data-plain/train_*.bin --val-data $OUT/data-plain/val_*.bin" \
                 "--seq 64 --batch 32 --steps 1600 --lr 4e-3 --warmup 50 --lr-final-frac 0.1" \
                 "--weight-decay 0.1 --clip 1.0 --init-std 0.02 --eval-every ${EVAL_EVERY:-100}" ;;
        *) echo "lab_seeds: unknown recipe '$1' (after or before)" >&2; exit 1 ;;
    esac
}

for recipe in $RECIPES; do
    flags=$(recipe_flags "$recipe")
    mkdir -p "$OUT/$recipe"
    echo "== $recipe: $(echo $SEEDS | wc -w) seeds, $PAR at a time: ./train_gpt2cpu $flags $EXTRA"
    running=0
    for seed in $SEEDS; do
        log="$OUT/$recipe/seed_$seed.out"
        (
            nice -n "$NICE" ./train_gpt2cpu --seed "$seed" --threads 1 --sample-every 0 --accuracy "$EXAMPLES" \
                $flags $EXTRA >"$log" 2>&1 || echo "lab_seeds: seed $seed failed (see $log)" >&2
            acc=$(grep -o 'accuracy [0-9.]*%' "$log" | tail -1)
            echo "   $recipe seed $seed: $acc"
        ) &
        running=$((running + 1))
        if [ "$running" -ge "$PAR" ]; then wait -n; running=$((running - 1)); fi
    done
    wait
done

py=
for cand in /usr/bin/python3 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import matplotlib" >/dev/null 2>&1; then py=$cand; break; fi
done
"${py:-python3}" scripts/lab_seeds_report.py "$OUT" $RECIPES
