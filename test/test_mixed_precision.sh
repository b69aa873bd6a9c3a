#!/usr/bin/env bash
# Mixed precision on the trainer (doc/precision.md): loss scaling, the 16-bit formats, FP8.
#   (a) a fixed power-of-two loss scale in fp32 changes no bit: --loss-scale 1024 writes the same
#       --log as no scaling (S multiplies every gradient exactly and AdamW divides it out exactly);
#   (b) a forced overflow (fp16, first scale 2^30): step 1 is skipped, the scale halves, the
#       weights (--save) and AdamW's t (--save-state's manifest) are those of before the step;
#   (c) dynamic growth: with --loss-scale-window 2 the scale doubles every 2 clean steps;
#   (d) an overflow on ONE rank (dp 2, --fault nan:1:2) skips the step on both: the weights equal
#       those of a 1-step run, and the run goes on;
#   (e) fp16 without scaling flushes gradients to zero (the summary's percentage > 1%), with
#       dynamic scaling it does not (< 0.1%): the underflow loss scaling exists for;
#   (f) --fp8 current and delayed train: every step's loss differs from the fp32 run's (the
#       quantisation is on) by at most 5e-4 relative (E4M3 keeps 3 mantissa bits: up to 2^-4
#       relative error per value, which mostly averages out in the C-long dot products; measured
#       1.4e-4 on these 20 steps, the tolerance ~3.5x that, as test/test_gpt2.cu sets the bf16
#       ones), and the loss goes down; (f') with --recompute full, delayed scaling gives the same
#       --log bytes (the rebuilt forward replays the forward's scales and records no amax);
#   (g) the CPU's --precision bf16 against the emulated CUDA bf16 trainer (when the emulated build
#       exists): every step's loss within the bf16 tolerance of test/test_gpt2.cu (8e-4), and
#       closer on average than the CPU's fp32 run is; (g') the emulated CUDA trainer's loss scaling
#       (a NaN gradient skipped, the scale halved) and FP8 (llmc/cuda/fp8.cuh, within 5e-4 of bf16);
#   (h) perturbations: without the 1/S in the update (a) fails; without the skip (b) fails;
#   (i) the scaler's state (S, clean steps, skipped) is saved by --save-state and restored by --resume.
# Prints PASS/FAIL lines. About a minute on 2 cores.
set -u
cd "$(dirname "$0")/.."
T=build/mixed-precision-test
WHAT="mixed precision"
rm -rf "$T"
mkdir -p "$T"
. test/lib_mpi.sh
failures=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; failures=$((failures + 1)); }

# the thresholds below (fp16 underflow, fp8's loss differences) were set on the plain format and
# GPT-2's initialisation (std 0.02): both are pinned here (today's default job uses neither)
python3 dev/data/arithmetic.py --format plain --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { fail "data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
SMALL="--layers 2 --heads 2 --channels 32 --max-seq 32 --batch 8 --seq 16 --eval-every 0 --accuracy 0 --sample-every 0 --init-std 0.02"
TRAIN=./train_gpt2cpu

# (a) and its perturbation
scale_exact() {   # BIN LABEL: --loss-scale 1024 against no scaling, fp32
    local bin=$1 label=$2
    $bin $D $SMALL --steps 8 --log "$T/a0.log" >"$T/a0.out" 2>&1 && $bin $D $SMALL --steps 8 --loss-scale 1024 --log "$T/a1.log" >"$T/a1.out" 2>&1 &&
        cmp -s "$T/a0.log" "$T/a1.log"
}
if scale_exact $TRAIN ""; then pass "(a) --loss-scale 1024 in fp32: the same --log bytes as no scaling (8 steps)"
else fail "(a) --loss-scale 1024 changed the --log" "$(diff "$T/a0.log" "$T/a1.log" | head -4)"; fi

# (b) forced overflow: the weights and t before the step
$TRAIN $D $SMALL --steps 1 --lr 0 --precision fp16 --save "$T/init.bin" >"$T/b0.out" 2>&1 || fail "(b) making the fp16 start"
t_saved() { grep "^adamw_t " "$T/state/$(cat "$T/state/latest" 2>/dev/null)/manifest" 2>/dev/null; }   # AdamW's t in the saved state
overflow_run() {   # BIN: one step from init.bin with a first scale of 2^30
    rm -rf "$T/state"
    $1 $D --load "$T/init.bin" --batch 8 --seq 16 --eval-every 0 --accuracy 0 --sample-every 0 --steps 1 --precision fp16 \
        --loss-scale dynamic --loss-scale-init 1073741824 --save "$T/after.bin" --save-state "$T/state" >"$T/b.out" 2>&1
}
overflow_run $TRAIN
if grep -q "gradients overflow at loss scale 1.07374e+09: update skipped, scale 5.36871e+08" "$T/b.out" &&
    grep -q "scale 5.36871e+08 (1 skipped)" "$T/b.out" && cmp -s "$T/init.bin" "$T/after.bin" &&
    [ "$(t_saved)" = "adamw_t 0" ]; then
    pass "(b) overflow at scale 2^30: step skipped, scale halved to 2^29, weights unchanged (cmp), AdamW t still 0"
else
    fail "(b) forced overflow" "$(grep -E "overflow|^step" "$T/b.out" | head -3)" "saved state: $(t_saved)"
fi

# (c) growth
$TRAIN $D $SMALL --steps 5 --precision fp16 --loss-scale dynamic --loss-scale-init 1024 --loss-scale-window 2 >"$T/c.out" 2>&1
scales=$(grep -o "scale [0-9e+.]* (" "$T/c.out" | awk '{print $2}' | tr '\n' ' ')
if [ "$scales" = "1024 2048 2048 4096 4096 " ]; then pass "(c) --loss-scale-window 2: scale after each step $scales"
else fail "(c) dynamic growth: scales after each step '$scales', want '1024 2048 2048 4096 4096 '"; fi

# (d) one rank's overflow skips the step everywhere
CONST="--warmup 0 --lr-final-frac 1"
$MPIRUN -np 2 $TRAIN $D $SMALL $CONST --threads 1 --steps 1 --save "$T/d1.bin" >"$T/d1.out" 2>&1
$MPIRUN -np 2 $TRAIN $D $SMALL $CONST --threads 1 --steps 2 --loss-scale dynamic --fault nan:1:2 --save "$T/d2.bin" >"$T/d2.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "step 2: gradients overflow at loss scale 65536: update skipped, scale 32768" "$T/d2.out" &&
    cmp -s "$T/d1.bin" "$T/d2.bin"; then
    pass "(d) dp 2, NaN gradients on rank 1 only in step 2: both ranks skip it (weights = the 1-step run's), scale halved"
else
    fail "(d) one rank's overflow (exit $rc)" "$(grep -E "overflow|error" "$T/d2.out" | head -3)"
fi

# (e) fp16 underflow with and without scaling
$TRAIN $D $SMALL --steps 20 --precision fp16 >"$T/e0.out" 2>&1
$TRAIN $D $SMALL --steps 20 --precision fp16 --loss-scale dynamic >"$T/e1.out" 2>&1
f0=$(grep "fp16 rounding, gradients" "$T/e0.out" | awk '{print $4}' | tr -d '%')
f1=$(grep "fp16 rounding, gradients" "$T/e1.out" | awk '{print $4}' | tr -d '%')
if [ -n "$f0" ] && [ -n "$f1" ] && awk -v a="$f0" -v b="$f1" 'BEGIN { exit !(a > 1.0 && b < 0.1) }'; then
    pass "(e) fp16 gradients flushed to zero: $f0% without loss scaling, $f1% with dynamic scaling"
else
    fail "(e) fp16 underflow: '$f0'% without scaling (want > 1), '$f1'% with (want < 0.1)"
fi

# (f) FP8
$TRAIN $D $SMALL --steps 20 --log "$T/f32.log" >/dev/null 2>&1
for mode in current delayed; do
    $TRAIN $D $SMALL --steps 20 --fp8 $mode --log "$T/f8.log" >"$T/f8.out" 2>&1
    res=$(paste "$T/f32.log" "$T/f8.log" | awk 'NR == 1 { first = $6 } { r = ($6 - $2) / $2; if (r < 0) r = -r; if (r > m) m = r; last = $6 }
        END { printf "%.2e %d", m, (NR == 20 && m > 0 && m < 5e-4 && last < first - 0.3) }')
    if [ "${res#* }" = "1" ]; then pass "(f) --fp8 $mode: 20 steps, losses within ${res% *} of fp32 (tolerance 5e-4, and not equal: quantised), descending"
    else fail "(f) --fp8 $mode: largest relative loss difference ${res% *} (want 0 < it < 5e-4) or no descent" "$(tail -2 "$T/f8.out")"; fi
done

# (f') FP8 with recomputation: the rebuilt forward replays the forward's scales (delayed: no second amax)
$TRAIN $D $SMALL --steps 20 --precision bf16 --fp8 delayed --fp8-history 1 --log "$T/f8n.log" >/dev/null 2>&1
$TRAIN $D $SMALL --steps 20 --precision bf16 --fp8 delayed --fp8-history 1 --recompute full --log "$T/f8r.log" >/dev/null 2>&1
if [ -s "$T/f8n.log" ] && cmp -s "$T/f8n.log" "$T/f8r.log"; then pass "(f') --fp8 delayed, bf16, --recompute full: the same --log bytes as without recomputation"
else fail "(f') --fp8 delayed with --recompute full changed the --log" "$(cmp "$T/f8n.log" "$T/f8r.log" 2>&1)"; fi

# (g) the CPU's bf16 against the emulated GPU's
EMU=build/emu/train_gpt2cu
if [ -x "$EMU" ]; then
    $EMU $D $SMALL --steps 20 --threads 2 --log "$T/g_emu.log" >"$T/g.out" 2>&1
    $TRAIN $D $SMALL --steps 20 --precision bf16 --log "$T/g_bf16.log" >/dev/null 2>&1
    res=$(paste "$T/g_emu.log" "$T/g_bf16.log" "$T/f32.log" | awk '{ a = ($6 - $2) / $2; b = ($10 - $2) / $2; if (a < 0) a = -a; if (b < 0) b = -b;
        if (a > m) m = a; sa += a; sb += b } END { printf "%.2e %.2e %.2e %d", m, sa / NR, sb / NR, (NR == 20 && m < 8e-4 && sa < sb) }')
    set -- $res
    if [ "$4" = "1" ]; then pass "(g) CPU --precision bf16 vs the emulated CUDA bf16 trainer: largest step-loss difference $1 (tol 8e-4), mean $2 (CPU fp32: $3)"
    else fail "(g) CPU bf16 vs emulated bf16: largest $1 (tol 8e-4), mean $2 vs fp32's $3" "$(tail -2 "$T/g.out")"; fi
    # (g') the CUDA code of loss scaling and FP8 (llmc/cuda/fp8.cuh), emulated: a NaN in step 2's gradients
    # is skipped and halves the scale; FP8 differs from bf16 by 0 < d < 5e-4 as on the CPU
    $EMU $D $SMALL --steps 3 --threads 2 --loss-scale dynamic --fault nan:2 >"$T/g2.out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q "step 2: gradients overflow at loss scale 65536: update skipped, scale 32768" "$T/g2.out"; then
        pass "(g') emulated CUDA trainer, --loss-scale dynamic: NaN gradients in step 2 skipped, scale 65536 -> 32768, run goes on"
    else fail "(g') emulated CUDA loss scaling (exit $rc)" "$(grep -E 'overflow|error' "$T/g2.out" | head -2)"; fi
    $EMU $D $SMALL --steps 20 --threads 2 --fp8 current --log "$T/g_fp8.log" >"$T/g3.out" 2>&1
    res=$(paste "$T/g_emu.log" "$T/g_fp8.log" | awk '{ r = ($6 - $2) / $2; if (r < 0) r = -r; if (r > m) m = r } END { printf "%.2e %d", m, (NR == 20 && m > 0 && m < 5e-4) }')
    if [ "${res#* }" = "1" ]; then pass "(g') emulated CUDA trainer, --fp8 current: losses within ${res% *} of its bf16 run (0 < d < 5e-4)"
    else fail "(g') emulated CUDA --fp8 current: largest difference ${res% *} (want 0 < d < 5e-4)" "$(tail -2 "$T/g3.out")"; fi
else
    echo "== (g) skipped: $EMU not built (make build/emu/train_gpt2cu)"
fi

# (i) the loss scaler travels with the training state: stopped after step 4 of 8 and resumed, the
# same --log bytes and the same scale at the end as the uninterrupted run (S grew 1024 -> 4096 by then)
F="--precision fp16 --loss-scale dynamic --loss-scale-init 1024 --loss-scale-window 2 --steps 8"
$TRAIN $D $SMALL $F --log "$T/i_a.log" >"$T/i_a.out" 2>&1
rm -rf "$T/i_state"
$TRAIN $D $SMALL $F --save-state "$T/i_state" --exit-after 4 >"$T/i_b1.out" 2>&1
$TRAIN $D $SMALL $F --resume "$T/i_state" --log "$T/i_b.log" >"$T/i_b.out" 2>&1
sa=$(grep "^step    8/8" "$T/i_a.out" | grep -o "scale [0-9e+.]* ([0-9]* skipped)")
sb=$(grep "^step    8/8" "$T/i_b.out" | grep -o "scale [0-9e+.]* ([0-9]* skipped)")
if [ -s "$T/i_a.log" ] && cmp -s "$T/i_a.log" "$T/i_b.log" && [ -n "$sa" ] && [ "$sa" = "$sb" ]; then
    pass "(i) --save-state/--resume with dynamic loss scaling: the same --log bytes, '$sa' at step 8 in both"
else
    fail "(i) resume with loss scaling" "uninterrupted '$sa', resumed '$sb'" "$(cmp "$T/i_a.log" "$T/i_b.log" 2>&1)"
fi

# (h) perturbations
# (the deliberate bugs of test/perturbations.py: the update without its 1/S; no skip on overflow)
if perturbed_build "no 1/S"; then
    if scale_exact "$T/perturbed/train" ""; then fail "(h) without the 1/S in the update, (a) still passes"
    else pass "(h) without the 1/S in the update, (a) fails"; fi
fi
if perturbed_build "no skip"; then
    overflow_run "$T/perturbed/train"
    if cmp -s "$T/init.bin" "$T/after.bin" || [ "$(t_saved)" = "adamw_t 0" ]; then
        fail "(h) without the skip, (b) still passes"
    else pass "(h) without the skip, (b) fails: the overflowing step reached AdamW"; fi
fi
[ "$failures" -eq 0 ]
