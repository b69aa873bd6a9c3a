#!/usr/bin/env bash
# train_gpt2cu under the CUDA emulator (dev/emu), no GPU needed:
#   (a) the emulated bf16 trainer against train_gpt2cpu on the same tiny model and data for 10
#       steps: losses and gradient norms within the bf16 tolerances of test/test_gpt2.cu (step
#       losses 8e-4, norms 1e-2 relative, ~3x the errors measured there); the fp32 emulated
#       trainer within 1e-4;
#   (b) determinism: two emulated runs write byte-identical --log files (loss, norm, lr at full
#       precision; no times) and byte-identical checkpoints;
#   (b') --recompute full (llmc/model/recompute.h) writes the same --log bytes as the run without, and its
#       activation bytes equal the formula;
#   (c) save/resume: a 5-step checkpoint reloads bit-exactly (load, one step at lr 0, save:
#       identical bytes), a run resumed from it twice gives identical bits (the optimizer state's
#       save/resume of test/optimizer_state.h, test_gpt2cu's determinism check, runs in the gpu-bundle
#       suite's reference rows); the trainer's training state
#       (--save-state, --exit-after 5, --resume; one rank and ZeRO-1 on 2) gives the same --log
#       bytes as the uninterrupted run, and the bf16 state continues on train_gpt2cpu within (a)'s
#       tolerances;
#   (d) the bf16 build's command-line errors: one line and exit 1;
#   (e) --profile (llmc/profile_events.cuh): after 3 steps the table has a row for every operation
#       of the step, the same rows and calls per step as train_gpt2cpu's table (the PROFILE_OP lines
#       of llmc/cuda mirror llmc/cpu's), its rows and "other" add up to "step" (print rounding), the
#       events lie inside the step ("other" is not negative), and the ceilings say they are the emulator's.
# Needs: make build/emu/train_gpt2cu build/emu/train_gpt2cu_fp32 build/emu/test_gpt2cu build/emu/test_gpt2cu_fp32 train_gpt2cpu
# Prints PASS/FAIL lines; exits 1 on any FAIL. About a minute on 2 cores.
set -u
cd "$(dirname "$0")/.."
T=build/emu-trainer-test
EMU=build/emu
rm -rf "$T"
mkdir -p "$T"
failures=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; failures=$((failures + 1)); }

for b in $EMU/train_gpt2cu $EMU/train_gpt2cu_fp32 $EMU/test_gpt2cu ./train_gpt2cpu; do
    if [ ! -x "$b" ]; then
        fail "missing $b" "build it: make build/emu/train_gpt2cu build/emu/train_gpt2cu_fp32 build/emu/test_gpt2cu train_gpt2cpu"
        exit 1
    fi
done
python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { fail "data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
SMALL="--layers 2 --heads 2 --channels 32 --max-seq 32 --batch 4 --seq 16 --eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 2"

# compare_logs NAME REF.log RUN.log LOSS_TOL NORM_TOL: every step's loss and norm within tol (relative)
compare_logs() {
    python3 - "$@" <<'EOF'
import sys
name, ref, run, ltol, ntol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
def rows(p): return [tuple(float(x) for x in line.split()[:3]) for line in open(p) if line.strip()]
a, b = rows(ref), rows(run)
print(f"  step   loss cpu      loss emu      rel err    norm cpu    norm emu    rel err")
le = ne = 0.0
for (s, l1, n1), (_, l2, n2) in zip(a, b):
    el, en = abs(l2 - l1) / abs(l1), abs(n2 - n1) / abs(n1)
    le, ne = max(le, el), max(ne, en)
    print(f"  {int(s):4d}   {l1:.7f}     {l2:.7f}     {el:.2e}   {n1:.6f}    {n2:.6f}    {en:.2e}")
ok = len(a) == 10 and len(b) == 10 and le <= ltol and ne <= ntol
print(f"{'PASS' if ok else 'FAIL'} {name}: 10 steps, loss rel err {le:.1e} (tol {ltol:g}), norm rel err {ne:.1e} (tol {ntol:g})")
sys.exit(0 if ok else 1)
EOF
}

# --- (a) against the CPU trainer
./train_gpt2cpu $D $SMALL --steps 10 --log "$T/cpu.log" >"$T/cpu.out" 2>&1 || fail "train_gpt2cpu run" "$(tail -2 "$T/cpu.out")"
$EMU/train_gpt2cu $D $SMALL --steps 10 --log "$T/bf16_a.log" --save "$T/bf16_a.bin" >"$T/bf16_a.out" 2>&1 ||
    fail "train_gpt2cu (emulated bf16) run" "$(tail -2 "$T/bf16_a.out")"
compare_logs "train_gpt2cu (emulated, bf16) vs train_gpt2cpu" "$T/cpu.log" "$T/bf16_a.log" 8e-4 1e-2 || failures=$((failures + 1))

# the fp32 emulated trainer (dev/emu/emu.mk builds it beside the bf16 one)
$EMU/train_gpt2cu_fp32 $D $SMALL --steps 10 --log "$T/fp32.log" >"$T/fp32.out" 2>&1 ||
    fail "train_gpt2cu (emulated fp32) run" "$(tail -2 "$T/fp32.out")"
compare_logs "train_gpt2cu (emulated, fp32) vs train_gpt2cpu" "$T/cpu.log" "$T/fp32.log" 1e-4 1e-4 || failures=$((failures + 1))

# --- (b) determinism
$EMU/train_gpt2cu $D $SMALL --steps 10 --log "$T/bf16_b.log" --save "$T/bf16_b.bin" >"$T/bf16_b.out" 2>&1
if [ -s "$T/bf16_a.log" ] && cmp -s "$T/bf16_a.log" "$T/bf16_b.log" && cmp -s "$T/bf16_a.bin" "$T/bf16_b.bin"; then
    pass "determinism (emulated bf16): two 10-step runs write identical step logs and checkpoints"
else
    fail "determinism (emulated bf16)" "the step logs or the checkpoints of two identical runs differ"
fi

# --- (b') activation recomputation (llmc/model/recompute.h): the bf16 kernels rerun on the kept inputs give
# the same bits, so --recompute full writes the --log of the run without; its activation bytes
# equal gpt2_activation_formula at 2 bytes a value
$EMU/train_gpt2cu $D $SMALL --steps 10 --recompute full --log "$T/bf16_full.log" >"$T/bf16_full.out" 2>&1
if [ -s "$T/bf16_a.log" ] && cmp -s "$T/bf16_a.log" "$T/bf16_full.log" &&
   grep -q '^activations  recompute full: .* measured = .* (equal' "$T/bf16_full.out"; then
    pass "--recompute full (emulated bf16): the --log is byte-identical to the run without; $(grep -m1 '^activations  recompute' "$T/bf16_full.out" | cut -c14-80)"
else
    fail "--recompute full (emulated bf16)" "$(grep -m1 -E '^activations  recompute|error' "$T/bf16_full.out")" "$(cmp "$T/bf16_a.log" "$T/bf16_full.log" 2>&1)"
fi

# --- (c) save / resume
$EMU/train_gpt2cu $D $SMALL --steps 5 --log "$T/five.log" --save "$T/five.bin" >"$T/five.out" 2>&1
if cmp -s "$T/five.log" <(head -5 "$T/bf16_a.log"); then
    pass "save at step 5: the 5-step run repeats the first 5 steps of the 10-step run bit for bit"
else
    fail "5-step run" "its log differs from the first 5 lines of the 10-step run"
fi
LOAD="$EMU/train_gpt2cu $D --batch 4 --seq 16 --eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 2"
$LOAD --load "$T/five.bin" --steps 1 --lr 0 --weight-decay 0 --save "$T/five_rt.bin" >"$T/rt.out" 2>&1
if cmp -s "$T/five.bin" "$T/five_rt.bin"; then
    pass "checkpoint reloads bit-exactly (emulated bf16: load, one step at lr 0, save: identical bytes)"
else
    fail "checkpoint round trip (emulated bf16)" "$(tail -2 "$T/rt.out")"
fi
$LOAD --load "$T/five.bin" --steps 5 --log "$T/res1.log" --save "$T/res1.bin" >"$T/res1.out" 2>&1
$LOAD --load "$T/five.bin" --steps 5 --log "$T/res2.log" --save "$T/res2.bin" >"$T/res2.out" 2>&1
if [ -s "$T/res1.log" ] && cmp -s "$T/res1.log" "$T/res2.log" && cmp -s "$T/res1.bin" "$T/res2.bin"; then
    pass "resumed from the step-5 checkpoint, twice: identical logs and checkpoints"
else
    fail "resume from checkpoint" "two resumed runs differ" "$(tail -2 "$T/res1.out")"
fi
# the training state (llmc/train/train_state.h): stopped after step 5 of 10 and resumed = the 10-step
# run, bit for bit: bf16 parameters, fp32 master weights, m, v and the data position restored
rm -rf "$T/tstate"
$EMU/train_gpt2cu $D $SMALL --steps 10 --save-state "$T/tstate" --exit-after 5 >"$T/ts1.out" 2>&1
$EMU/train_gpt2cu $D $SMALL --steps 10 --resume "$T/tstate" --log "$T/ts.log" >"$T/ts2.out" 2>&1
if [ -s "$T/ts.log" ] && cmp -s "$T/ts.log" "$T/bf16_a.log"; then
    pass "training state (emulated bf16): stopped after step 5 of 10, resumed: the --log is byte-identical to the 10-step run's"
else
    fail "training state resume (emulated bf16)" "$(grep -h -m2 error "$T/ts1.out" "$T/ts2.out")" "$(diff "$T/ts.log" "$T/bf16_a.log" | head -3)"
fi
# the bf16 state continued by the fp32 CPU trainer (from the master weights): steps 6-10 within
# the bf16 tolerances of (a) of the emulated run that never stopped
./train_gpt2cpu $D $SMALL --steps 10 --resume "$T/tstate" --log "$T/ts_cpu.log" >"$T/ts3.out" 2>&1 ||
    fail "the bf16 state on the CPU trainer" "$(grep -m2 error "$T/ts3.out")"
compare_logs "the bf16 state (step 5) continued by train_gpt2cpu vs the emulated bf16 run" "$T/bf16_a.log" "$T/ts_cpu.log" 8e-4 1e-2 ||
    failures=$((failures + 1))
if command -v mpirun >/dev/null; then   # ZeRO-1 on 2 ranks: each rank's block of master, m, v
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    EMUMPI="timeout 300 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1 -np 2"
    ONE="$D ${SMALL/--threads 2/--threads 1} --steps 10 --zero 1"
    rm -rf "$T/zstate"
    $EMUMPI $EMU/train_gpt2cu $ONE --log "$T/z_a.log" >"$T/z0.out" 2>&1
    $EMUMPI $EMU/train_gpt2cu $ONE --save-state "$T/zstate" --exit-after 5 >"$T/z1.out" 2>&1
    $EMUMPI $EMU/train_gpt2cu $ONE --resume "$T/zstate" --log "$T/z_b.log" >"$T/z2.out" 2>&1
    if [ -s "$T/z_a.log" ] && cmp -s "$T/z_a.log" "$T/z_b.log"; then
        pass "training state (emulated bf16, ZeRO-1 on 2 ranks): the resumed --log is byte-identical"
    else
        fail "training state resume (emulated bf16, ZeRO-1)" "$(grep -h -m2 error "$T"/z?.out)"
    fi
fi
# The optimizer state's save/resume of test/optimizer_state.h (test_gpt2cu's determinism check: save at 3,
# reload, continue to the end = uninterrupted, bit for bit) is checked by the gpu-bundle suite: its
# reference rows run test_gpt2cu --check, which ends with that check, on the same kind of inputs.

# --- (d) command-line errors of the bf16 build: one line on stderr, exit 1
expect_error() {
    local name=$1 pattern=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$T/err"; then
        pass "train_gpt2cu (emulated) $name: $(head -1 "$T/err")"
    else
        fail "train_gpt2cu (emulated) $name" "exit status $rc (want 1), stderr: $(head -2 "$T/err")" "wanted: $pattern"
    fi
}
TRAIN="$EMU/train_gpt2cu $D $SMALL"
expect_error "unknown flag" "unknown flag '--bogus'" $TRAIN --bogus 3
expect_error "non-numeric value" "flag '--lr' expects a number, got 'abc'" $TRAIN --lr abc
expect_error "sequence above the model maximum" "\-\-seq 64 exceeds the model's maximum sequence length 32" $TRAIN --seq 64
expect_error "missing checkpoint" "cannot open '$T/missing.bin'" $LOAD --load "$T/missing.bin" --steps 1

# --- (e) --profile: the table per operation, timed with CUDA events (the emulator's own time)
$EMU/train_gpt2cu $D $SMALL --steps 3 --profile >"$T/prof.out" 2>&1 || fail "train_gpt2cu --profile (emulated) run" "$(tail -2 "$T/prof.out")"
./train_gpt2cpu $D $SMALL --steps 3 --profile >"$T/prof_cpu.out" 2>&1 || fail "train_gpt2cpu --profile run" "$(tail -2 "$T/prof_cpu.out")"
python3 - "$T/prof.out" "$T/prof_cpu.out" <<'EOF' || failures=$((failures + 1))
import re, sys
def table(path):   # {"name part": (calls, ms)} ("matmul 32x96 fwd": one row per shape), other and step ms, two lines
    rows, other, step, roof, ceil = {}, None, None, None, None
    for line in open(path):
        m = re.match(r"^(\S.*?)\s+(fwd|bwd|update|comm)\s+([\d.]+)\s+(-?[\d.]+)\s+-?[\d.]+%", line)
        if m:
            rows[m.group(1) + " " + m.group(2)] = (float(m.group(3)), float(m.group(4)))
        m = re.match(r"^(other|step)\s+(-?[\d.]+)\s+-?[\d.]+%", line)
        if m and m.group(1) == "other": other = float(m.group(2))
        if m and m.group(1) == "step": step = float(m.group(2))
        if line.startswith("roofline "): roof = line.strip()
        if line.startswith("profile      ceilings"): ceil = line.strip()
    return rows, other, step, roof, ceil
rows, other, step, roof, ceil = table(sys.argv[1])
cpu_rows = table(sys.argv[2])[0]
ops = {re.sub(r" \d+x\d+ ", " ", k) for k in rows}   # matmul's rows without their shapes
want = ["encoder fwd", "encoder bwd", "layernorm fwd", "layernorm bwd", "matmul fwd", "matmul bwd", "attention fwd",
        "attention bwd", "gelu fwd", "gelu bwd", "residual fwd", "classifier fwd", "global norm update", "adamw update",
        "zero grad update"]
missing = [w for w in want if w not in ops]
calls = {k: v[0] for k, v in rows.items()}
cpu_calls = {k: v[0] for k, v in cpu_rows.items()}
differ = sorted(set(calls.items()) ^ set(cpu_calls.items()))
total = sum(v[1] for v in rows.values())
slack = 0.005 * (len(rows) + 2) + 1e-9   # each figure printed to 0.01 ms
checks = [
    (roof is not None, "the roofline line is printed"),
    (ceil is not None and "emulator" in ceil, "the ceilings line says the figures are the emulator's"),
    (not missing, f"a row for each operation of the step (missing: {', '.join(missing) or 'none'})"),
    (len(calls) > 0 and not differ, f"the same {len(calls)} rows and calls per step as train_gpt2cpu's table "
                                    f"(differ: {', '.join(f'{k} {v:g}' for k, v in differ[:4]) or 'none'})"),
    (other is not None and step is not None and abs(total + other - step) <= slack,
     f"the rows ({total:.2f} ms) and other ({other} ms) add up to the step ({step} ms) within {slack:.3f} ms"),
    (other is not None and other >= -0.005, "the events lie inside the step: other is not negative"),
]
for ok, what in checks:
    print(f"{'PASS' if ok else 'FAIL'} --profile (emulated bf16): {what}")
sys.exit(0 if all(ok for ok, _ in checks) else 1)
EOF

[ "$failures" -eq 0 ] || exit 1
exit 0
