#!/usr/bin/env bash
# ZeRO++ on ZeRO-3 (llmc/parallel/dp_zeropp.h, doc/memory.md, ZeRO++): --qwz, --hpz N, --qgz 4|8, on 4
# CPU ranks (fp32) against plain --zero 3 with the same model, data and seed:
#   - the quantiser itself (llmc/cpu/quantize.h, compiled here): |x - x'| <= absmax/(2 qmax) in
#     every block, the wire size, NaN blocks, and the error statistics are upper bounds;
#   - hpZ alone: logs and checkpoints identical bit for bit to ZeRO-3 (G = 1, 2, 4);
#   - lr 0 (the weights never move, so nothing drifts): qwZ's loss within 6 ||g|| |dw|max of
#     ZeRO-3's at every step; qgZ's loss identical and its gradient norm within ||dg||_2 (a hard
#     bound: | ||g + e|| - ||g|| | <= ||e||);
#   - training (lr 1e-3, 8 steps): every step's loss within F_t + sum_{s<t} 2 lr_s ||dg_s||_1
#     (doc/memory.md, ZeRO++ derives it);
#   - bytes: every step, each collective's counted bytes = the formula the program prints, and
#     that formula = the one computed here from the model's shape;
#   - bad flags: a clear message on every rank;
#   - perturbations: the quantiser without round-to-nearest fails its check, the trainer whose
#     dequantisation drops the scale fails the lr-0 tolerances.
set -u
cd "$(dirname "$0")/.."
T=build/zeropp-test
rm -rf "$T"
mkdir -p "$T"
WHAT="ZeRO++"
start=$(date +%s)
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all, perturbed_build

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
L=2
C=64
MODEL="--layers $L --heads 2 --channels $C --batch 16 --seq 32 --warmup 2 --zero 3"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"
LR0="--lr 0 --steps 4"
TRAINING="--lr 1e-3 --steps 8"

# --- the quantiser on its own
cat >"$T/quant_check.cpp" <<'EOF'
#include <stdio.h>
#include <vector>
#include "llmc/cpu/memory.h"
#include "llmc/cpu/quantize.h"
int main() {
    int bad = 0;
    unsigned s = 12345;
    for (int bits : {8, 4}) {
        const size_t n = 1000;   // 3 full blocks and a short one
        std::vector<float> x(n), y(n), acc(n, 1.0f);
        for (size_t i = 0; i < n; i++) {
            s = s * 1664525u + 1013904223u;
            float mag = (i / QUANT_BLOCK == 1) ? 100.0f : (i / QUANT_BLOCK == 2 ? 1e-6f : 0.02f);
            x[i] = mag * ((s >> 8) / 16777216.0f * 2.0f - 1.0f);
        }
        std::vector<int32_t> wire(quant_words(n, bits));
        size_t want_words = 4 * (1 + QUANT_BLOCK * bits / 32);
        if (wire.size() != want_words) { printf("FAIL int%d wire: %zu words, want %zu\n", bits, wire.size(), want_words); bad = 1; }
        float stats[3] = {0, 0, 0};
        quantize_blocks(wire.data(), x.data(), n, bits, stats);
        dequantize_blocks(y.data(), wire.data(), n, bits);
        dequantize_accumulate(acc.data(), wire.data(), n, bits);
        double worst = 0, e2 = 0, e1 = 0, amax_all = 0;
        for (size_t b = 0; b < quant_num_blocks(n); b++) {
            size_t lo = b * QUANT_BLOCK, hi = lo + QUANT_BLOCK < n ? lo + QUANT_BLOCK : n;
            double amax = 0;
            for (size_t i = lo; i < hi; i++) { amax = fabs(x[i]) > amax ? fabs(x[i]) : amax; }
            amax_all = amax > amax_all ? amax : amax_all;
            for (size_t i = lo; i < hi; i++) {
                double err = fabs((double)x[i] - y[i]);
                worst = err / (amax / (2 * quant_qmax(bits))) > worst ? err / (amax / (2 * quant_qmax(bits))) : worst;
                e2 += err * err;
                e1 += err;
                if (acc[i] != 1.0f + y[i]) { bad = 1; }
            }
        }
        int ok = worst <= 1.0 + 1e-5 && stats[0] == (float)amax_all && e2 <= stats[1] * (1 + 1e-5) && e1 <= stats[2] * (1 + 1e-5);
        printf("%s int%d blocks of %d: max |x - x'| = %.6f x absmax/(2 qmax) (bound 1); stats bound ||e||_2^2 %.3e >= %.3e, ||e||_1 %.3e >= %.3e\n",
               ok ? "PASS" : "FAIL", bits, QUANT_BLOCK, worst, stats[1], e2, stats[2], e1);
        bad |= !ok;
        x[300] = NAN;   // block 1 dequantises to NaN, the others do not change
        quantize_blocks(wire.data(), x.data(), n, bits, NULL);
        dequantize_blocks(y.data(), wire.data(), n, bits);
        int nan_ok = 1;
        for (size_t i = 0; i < n; i++) { nan_ok &= (i / QUANT_BLOCK == 1) == (bool)isnan(y[i]); }
        printf("%s int%d: a NaN makes its block NaN and no other\n", nan_ok ? "PASS" : "FAIL", bits);
        bad |= !nan_ok;
    }
    return bad;
}
EOF
quant_check() {   # DIR (holding llmc/): builds and runs the check against that copy of the quantiser
    g++ -std=c++17 -O1 -fopenmp -DLLMC_CPU -I"$1" "$T/quant_check.cpp" -o "$T/quant_check" -lm && "$T/quant_check"
}
quant_check . || true

# --- the runs: NAME FLAGS... -> $T/NAME.{log,out,bin}
run() {
    local name=$1; shift
    # shellcheck disable=SC2086
    $MPIRUN -np 4 ./train_gpt2cpu $D $MODEL $QUIET "$@" --log "$T/$name.log" --save "$T/$name.bin" >"$T/$name.out" 2>&1 ||
        fail "$name: the run failed" "$(grep -v '^\s*$' "$T/$name.out" | tail -3)"
}
run z3_lr0 $LR0
run z3_train $TRAINING
for G in 1 2 4; do run "hpz${G}_train" $TRAINING --hpz $G; done
run qwz_lr0 $LR0 --qwz
run qgz8_lr0 $LR0 --qgz 8
run qgz4_lr0 $LR0 --qgz 4
run all_lr0 $LR0 --qwz --hpz 2 --qgz 8
run qwz_train $TRAINING --qwz
run qgz8_train $TRAINING --qgz 8
run qgz4_train $TRAINING --qgz 4
run all_train $TRAINING --qwz --hpz 2 --qgz 8
run all4_train $TRAINING --qwz --hpz 2 --qgz 4 --grad-accum 2
run all_native $TRAINING --qwz --hpz 2 --qgz 8 --comm-algo native

# --- hpZ changes who gathers from where, not a bit of the result
for G in 1 2 4; do
    if cmp -s "$T/z3_train.log" "$T/hpz${G}_train.log" && cmp -s "$T/z3_train.bin" "$T/hpz${G}_train.bin"; then
        pass "hpZ groups of $G: 8 training steps, log and checkpoint identical bit for bit to ZeRO-3"
    else
        fail "hpZ groups of $G differs from ZeRO-3" "$(diff "$T/z3_train.log" "$T/hpz${G}_train.log" | head -4)"
    fi
done

# the native collectives (MPI_Allgather, MPI_Alltoall) move the same codes: the result cannot change
if cmp -s "$T/all_train.log" "$T/all_native.log" && cmp -s "$T/all_train.bin" "$T/all_native.bin"; then
    pass "qwZ + hpZ 2 + qgZ int8: ring and pairwise collectives = native MPI ones, bit for bit"
else
    fail "qwZ + hpZ 2 + qgZ int8 with --comm-algo native differs from ring" "$(diff "$T/all_train.log" "$T/all_native.log" | head -4)"
fi

# --- the tolerances (doc/memory.md, ZeRO++): judge REF RUN MODE LABEL
cat >"$T/judge.py" <<'EOF'
import re, sys
ref, run, mode, label = sys.argv[1:5]
def log(p): return [tuple(map(float, l.split())) for l in open(p)]
def bounds(p):
    out = []
    for l in open(p):
        if "error bounds" not in l: continue
        d = {}
        m = re.search(r"\|dw\| <= (\S+), \|\|dw\|\|_2 <= (\S+), \|\|dw\|\|_1 <= (\S+)", l)
        if m: d["w"] = tuple(float(x.rstrip(",")) for x in m.groups())
        m = re.search(r"\|dg\| <= (\S+), \|\|dg\|\|_2 <= (\S+), \|\|dg\|\|_1 <= (\S+)", l)
        if m: d["g"] = tuple(float(x.rstrip(",")) for x in m.groups())
        out.append(d)
    return out
a, b, bd = log(ref), log(run + ".log"), bounds(run + ".out")
if len(a) != len(b) or len(bd) != len(b):
    print(f"FAIL {label}: {len(a)} reference steps, {len(b)} steps, {len(bd)} error-bound lines"); sys.exit(1)
ok, worst, drift, notes = True, 0.0, 0.0, []
for t, ((s, L0, g0, lr), (_, L1, g1, _), d) in enumerate(zip(a, b, bd)):
    F = 6 * g0 * d["w"][0] if "w" in d else 0.0      # qwZ: the forward on quantised weights
    dL = abs(L1 - L0)
    if mode == "lr0":
        if "w" not in d and L1 != L0:
            ok = False; notes.append(f"step {int(s)}: loss {L1!r} != {L0!r} (nothing quantised in the forward)")
        if "w" in d:
            worst = max(worst, dL / F)
            if dL > F: ok = False; notes.append(f"step {int(s)}: |dL| {dL:.3e} > 6 ||g|| |dw| = {F:.3e}")
        if "g" in d and "w" not in d:   # the norm: a hard bound
            dg = abs(g1 - g0)
            worst = max(worst, dg / d["g"][1])
            if dg > d["g"][1]: ok = False; notes.append(f"step {int(s)}: | ||g'|| - ||g|| | {dg:.3e} > ||dg||_2 {d['g'][1]:.3e}")
    else:
        tol = F + drift
        worst = max(worst, dL / tol if tol > 0 else (0 if dL == 0 else float("inf")))
        if dL > tol: ok = False; notes.append(f"step {int(s)}: |dL| {dL:.3e} > {tol:.3e} (forward {F:.3e} + drift {drift:.3e})")
        if "g" in d: drift += 2 * lr * d["g"][2]      # qgZ: the next updates' first-order effect
print(f"{'PASS' if ok else 'FAIL'} {label}: {len(b)} steps, largest difference / tolerance = {worst:.4f}; "
      f"final loss {b[-1][1]:.6f} vs ZeRO-3 {a[-1][1]:.6f}")
for n in notes[:4]: print("     " + n)
sys.exit(0 if ok else 1)
EOF
judge() { python3 "$T/judge.py" "$T/$1.log" "$T/$2" "$3" "$4"; }
judge z3_lr0 qwz_lr0 lr0 "qwZ, lr 0: |dL| <= 6 ||g|| |dw|max every step"
judge z3_lr0 qgz8_lr0 lr0 "qgZ int8, lr 0: loss identical, | ||g'|| - ||g|| | <= ||dg||_2 every step"
judge z3_lr0 qgz4_lr0 lr0 "qgZ int4, lr 0: loss identical, | ||g'|| - ||g|| | <= ||dg||_2 every step"
judge z3_lr0 all_lr0 lr0 "qwZ + hpZ 2 + qgZ int8, lr 0: |dL| <= 6 ||g|| |dw|max every step"
judge z3_train qwz_train train "qwZ, training: |dL_t| <= F_t"
judge z3_train qgz8_train train "qgZ int8, training: |dL_t| <= sum 2 lr_s ||dg_s||_1"
judge z3_train qgz4_train train "qgZ int4, training: |dL_t| <= sum 2 lr_s ||dg_s||_1"
judge z3_train all_train train "qwZ + hpZ 2 + qgZ int8, training: |dL_t| <= F_t + sum 2 lr_s ||dg_s||_1"
# (2 micro-steps: ZeRO-3's reduce-scatter and qgZ run per micro-step; the reference has 1, same global batch)
judge z3_train all4_train train "qwZ + hpZ 2 + qgZ int4, 2 micro-steps, training: |dL_t| <= F_t + sum 2 lr_s ||dg_s||_1"

# --- bytes: measured = printed formula on every step of every run, and the printed formula =
# the formula computed here from the shape (4 ranks; a block: 12 C^2 + 13 C values; the root:
# Psi - L block; every bucket padded to a multiple of 4; a = 4 bytes)
cat >"$T/bytes.py" <<'EOF'
import math, re, sys
L, C, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
text = open(out).read()
psi = int(re.search(r"Psi = (\d+) parameters", text).group(1))
flags = text.split("\n", 1)[0]
N, a = 4, 4
block = 12 * C * C + 13 * C
pad = lambda n: (n + N - 1) // N * N
buckets = [pad(block)] * L + [pad(psi - L * block)]
qwz = "qwZ on" in text
hpz = int(m.group(1)) if (m := re.search(r"hpZ groups of (\d+)", text)) else 0
qgz = int(m.group(1)) if (m := re.search(r"qgZ on \(int(\d)", text)) else 0
micro = int(sys.argv[4])
nb = lambda s: math.ceil(s / 256)
want = {"qwZ all-gather": 0, "hpZ group all-gather": 0, "qgZ all-to-all": 0}
for i, P in enumerate(buckets):
    S, root = P // N, i == L
    want["qwZ all-gather"] += (N - 1) * nb(S) * 260 * ((1 if root or hpz else 2) if qwz else 0)
    want["hpZ group all-gather"] += 0 if root or not hpz else (hpz - 1) * (P // hpz) * a
    want["qgZ all-to-all"] += (N - 1) * nb(S) * (256 * qgz // 8 + 4) if qgz else 0
lines = [l for l in text.splitlines() if l.startswith("   zero++ |")]
steps = len([l for l in text.splitlines() if l.startswith("step ")])
bad = []
for l in lines:
    for name, got, f, eq in re.findall(r"(qwZ all-gather|hpZ group all-gather|qgZ all-to-all) sent (\d+) B \(formula (\d+) B, (\w+)\)", l):
        if int(got) != int(f) or int(f) != want[name] * micro: bad.append(f"{name}: sent {got}, printed formula {f}, formula here {want[name] * micro}")
comm_ok = len(re.findall(r"comm \| sent .* equal\)", text)) == steps
on = {"qwZ all-gather": qwz, "hpZ group all-gather": hpz, "qgZ all-to-all": qgz}
shown = ", ".join(f"{k} {v * micro} B" for k, v in want.items() if on[k])
if bad or not lines or len(lines) != steps or not comm_ok:
    print(f"FAIL bytes {sys.argv[5]}: {len(lines)} zero++ lines for {steps} steps, step total = formula: {comm_ok}")
    for b in bad[:3]: print("     " + b)
    sys.exit(1)
print(f"PASS bytes {sys.argv[5]}: every step sent = formula: {shown} per step")
EOF
for r in "qwz_train|1|qwZ" "hpz2_train|1|hpZ 2" "hpz1_train|1|hpZ 1" "qgz8_train|1|qgZ int8" "qgz4_train|1|qgZ int4" "all_train|1|qwZ + hpZ 2 + qgZ int8" "all4_train|2|qwZ + hpZ 2 + qgZ int4, 2 micro-steps"; do
    IFS='|' read -r name micro label <<<"$r"
    python3 "$T/bytes.py" $L $C "$T/$name.out" "$micro" "$label"
done
# ZeRO-3's own formula for comparison, and the memory table with hpZ's secondary copy
z3=$(sed -n 's/.*comm | sent *\([0-9.]*\) MiB.*/\1/p' "$T/z3_train.out" | head -1)
all=$(sed -n 's/.*comm | sent *\([0-9.]*\) MiB.*/\1/p' "$T/all_train.out" | head -1)
echo "     (per step on each rank: ZeRO-3 $z3 MiB; qwZ + hpZ 2 + qgZ int8 $all MiB, of which the hpZ part stays inside a group of 2)"
n=0
for name in hpz1_train hpz2_train hpz4_train all_train all4_train qwz_train qgz8_train; do grep -q "memory check ok" "$T/$name.out" && n=$((n + 1)); done
if [ $n -eq 7 ]; then pass "memory table measured = formula on every rank in every run (hpZ's secondary copy counted as parameters)"
else fail "memory table with ZeRO++: $n of 7 runs agree" "$(grep -A3 'memory per rank' "$T/hpz2_train.out")"; fi

# --- bad input: every rank reports, all exit non-zero
expect_all "--hpz that does not divide the data-parallel ranks" "does not divide the 4 data-parallel ranks" 4 ./train_gpt2cpu $D $MODEL $QUIET --steps 1 --hpz 3
expect_all "--qwz without --zero 3" "need --zero 3" 2 ./train_gpt2cpu $D --layers 2 --channels 64 --batch 16 --seq 32 --zero 2 --qwz $QUIET --steps 1
expect_all "--qgz with a bit width other than 4 or 8" "--qgz must be 0, 4 or 8" 2 ./train_gpt2cpu $D $MODEL $QUIET --steps 1 --qgz 2

# --- perturbations: the checks must notice a broken quantiser
mkdir -p "$T/trunc/llmc/cpu"
cp -r llmc "$T/trunc/"
sed -i 's/int q = (int)rintf(x\[lo + i\] \* inv);/int q = (int)truncf(x[lo + i] * inv);/' "$T/trunc/llmc/cpu/quantize.h"
if grep -q truncf "$T/trunc/llmc/cpu/quantize.h" && ! quant_check "$T/trunc" >"$T/trunc.out" 2>&1; then
    pass "perturbation 'truncate instead of round' fails the quantiser check: $(grep -m1 FAIL "$T/trunc.out" | cut -c6-90)"
else
    fail "perturbation 'truncate instead of round' went unnoticed" "$(head -2 "$T/trunc.out")"
fi
if perturbed_build "dequantise without the scale"; then   # (test/perturbations.py: q, not q * scale)
    for r in "p_qwz_lr0|--qwz" "p_qgz_lr0|--qgz 8"; do   # (the run may stop on a non-finite loss: judged all the same)
        # shellcheck disable=SC2086
        $MPIRUN -np 4 "$T/perturbed/train" $D $MODEL $QUIET $LR0 ${r#*|} --log "$T/${r%%|*}.log" >"$T/${r%%|*}.out" 2>&1
    done
    for r in "p_qwz_lr0|qwZ" "p_qgz_lr0|qgZ int8"; do
        IFS='|' read -r name label <<<"$r"
        if judge z3_lr0 "$name" lr0 x >"$T/p.cmp" 2>&1; then
            fail "perturbation 'dequantise without the scale' went unnoticed by the $label lr-0 check" "$(cat "$T/p.cmp")"
        else
            pass "perturbation 'dequantise without the scale' fails the $label lr-0 check: $(sed -n 2p "$T/p.cmp" | sed 's/^ *//' | cut -c1-90)"
        fi
    done
fi
echo "test_zeropp: $(($(date +%s) - start)) s"
exit 0
