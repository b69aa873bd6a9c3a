#!/usr/bin/env bash
# Activation recomputation (--recompute none|selective|full; llmc/model/recompute.h, doc/memory.md)
# on CPU ranks in fp32:
#   - bit-identical: the --log (loss, gradient norm, lr at full precision) of selective and of full
#     recomputation is byte for byte the one without (cmp), on one rank, with dp 2, tp 2, tp 2 +
#     SP, dp 2 with ZeRO-3 (weights gathered in the backward's hooks), a 1F1B and an interleaved
#     pipeline (pp 2, several slots in flight sharing the one scratch block), context parallelism
#     (cp 2: the ring and the all-to-all attention ops rerun), MoE blocks with expert parallelism
#     (ep 2: an MoE block's MLP is not rerun) and RLVR (whose reference model keeps everything);
#     the samples and greedy accuracy under recomputation equal those without (generation shares
#     gpt2_block_compute, with its own buffers);
#   - memory: on every rank the activation bytes allocated equal gpt2_activation_formula for the
#     mode (the trainer's "activations ... measured = formula" line), and they drop as expected:
#     full < selective < none; each mode's average step time is printed (not asserted);
#   - refused: --recompute with --pp-schedule zb-h1 (its split backward reads activations twice);
#   - the test can fail: a trainer whose selective recomputation skips the GELU, and one whose
#     full recomputation skips the MLP, must give a --log different from no recomputation.
# Prints PASS/FAIL lines; about a minute on 2 cores.
set -u
cd "$(dirname "$0")/.."
T=build/recompute-test
rm -rf "$T"
mkdir -p "$T"
WHAT="activation recomputation"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, perturbed_build; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 2000 --num-val 200 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
# 2 layers, 4 heads of 16 channels: tp 2 divides heads, channels and the padded vocab (320)
MODEL="--layers 2 --heads 4 --channels 64 --batch 8 --seq 32 --steps 5 --lr 1e-3 --warmup 2"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0"
MODES="none selective full"

# modes NP LABEL [TRAINER] -- FLAGS...: the three modes on NP ranks (NP 1: no mpirun) into
# $T/LABEL.MODE.{log,out}; PASS when the three logs are identical, every run's activations
# equal the formula on all ranks, and no strategy's memory or byte check says FAILED/DIFFERENT
modes() {
    local np=$1 label=$2 trainer=./train_gpt2cpu
    shift 2
    if [ "$1" != "--" ]; then trainer=$1; shift; fi
    shift
    local m tag="${label// /_}" bad="" threads="--threads 1"
    [ "$np" -eq 1 ] && threads="--threads 2"
    for m in $MODES; do
        local launch=""
        [ "$np" -gt 1 ] && launch="$MPIRUN -np $np"
        # shellcheck disable=SC2086
        if ! $launch $trainer $D $MODEL $QUIET $threads "$@" --recompute "$m" --log "$T/$tag.$m.log" >"$T/$tag.$m.out" 2>&1; then
            fail "$label, --recompute $m: the run failed" "$(grep -v '^\s*$' "$T/$tag.$m.out" | tail -3)"
            return 1
        fi
        grep -q "^activations  recompute $m: .* measured = .* (equal on all $np ranks)" "$T/$tag.$m.out" ||
            bad="$bad; activations != formula ($m): $(grep -m1 '^activations  recompute' "$T/$tag.$m.out" | cut -c1-110)"
        # the strategies' own checks (tp/pp memory, tp/cp bytes) count the recomputation too
        if grep -qE "DIFFERENT|FAILED" "$T/$tag.$m.out"; then
            bad="$bad; $m: $(grep -m1 -E 'DIFFERENT|FAILED' "$T/$tag.$m.out" | cut -c1-110)"
        fi
    done
    for m in selective full; do
        cmp -s "$T/$tag.none.log" "$T/$tag.$m.log" || bad="$bad; --log of $m differs from none: $(cmp "$T/$tag.none.log" "$T/$tag.$m.log" 2>&1)"
    done
    if [ -n "$bad" ]; then
        fail "$label" "${bad#; }"
        return 1
    fi
    pass "$label: --log identical for none, selective, full ($(wc -l <"$T/$tag.none.log") steps); activations = formula on all $np ranks: $(for m in $MODES; do grep -m1 "^activations  recompute $m" "$T/$tag.$m.out" | sed 's/.*recompute \([a-z]*\): \([0-9.]*\) MiB.*/\1 \2/'; done | tr '\n' ',' | sed 's/,$//; s/,/, /g') MiB"
}

# the activation bytes a mode's run measured (MiB, from its line)
acts_of() { grep -m1 "^activations  recompute $2" "$T/$1.$2.out" | sed 's/.*recompute [a-z]*: \([0-9.]*\) MiB.*/\1/'; }

modes 1 "1 rank" -- --sample-every 5 --accuracy 8
n=$(acts_of 1_rank none) s=$(acts_of 1_rank selective) f=$(acts_of 1_rank full)
if python3 -c "import sys; sys.exit(0 if $f < $s < $n else 1)"; then
    pass "activation memory drops: full $f < selective $s < none $n MiB (1 rank)"
else
    fail "activation memory does not drop as expected" "full $f, selective $s, none $n MiB"
fi
gen() { grep -E '^(sample|val loss)' "$T/1_rank.$1.out"; }
if [ -n "$(gen none)" ] && [ "$(gen none)" = "$(gen full)" ] && [ "$(gen none)" = "$(gen selective)" ]; then
    pass "generation and evaluation under recomputation: the samples and the greedy accuracy equal those without"
else
    fail "generation under recomputation" "$(diff <(gen none) <(gen full) | head -3)"
fi
echo "step time (1 rank, 2 threads, 5 steps; average excluding the first):$(for m in $MODES; do
    printf ' %s %s ms' "$m" "$(grep -m1 '^average step' "$T/1_rank.$m.out" | sed 's/.*: \([0-9.]*\) ms.*/\1/')"; done)"

SFTD="--sft-train $T/data/sft_train_*.bin --sft-val $T/data/sft_val_*.bin"
modes 1 "RLVR (GRPO + KL, the reference model without recomputation), 1 rank" -- --task rlvr --batch 8 --group 4 --kl 0.1 $SFTD
modes 2 "dp 2" -- --dp 2
modes 2 "dp 2, ZeRO-3" -- --dp 2 --zero 3
modes 2 "tp 2" -- --tp 2
modes 2 "tp 2 + SP" -- --tp 2 --sp
modes 2 "pp 2, 1F1B, 2 micro-batches" -- --pp 2 --grad-accum 2
modes 2 "pp 2, interleaved (2 chunks), 2 micro-batches" -- --layers 4 --pp 2 --pp-schedule interleaved --grad-accum 2
modes 2 "cp 2 (ring attention)" -- --cp 2
modes 2 "cp 2 (all-to-all attention, its state holds the gathered qkv)" -- --cp 2 --cp-algo alltoall
modes 2 "MoE 4 experts top-2, ep 2" -- --moe-experts 4 --moe-topk 2 --moe-every 1 --moe-capacity 1.0 --ep 2

# --- refused: the zero-bubble schedule's split backward
if ./train_gpt2cpu $D --recompute full --pp 2 --pp-schedule zb-h1 >"$T/zb.out" 2>&1; then
    fail "--recompute full with --pp-schedule zb-h1 was accepted"
elif grep -q "does not combine with --pp-schedule zb-h1" "$T/zb.out"; then
    pass "refused: $(grep -m1 'zb-h1' "$T/zb.out" | sed 's/^error: //' | cut -c1-100)..."
else
    fail "--recompute full with zb-h1: not the expected message" "$(tail -2 "$T/zb.out")"
fi

# --- the test can fail: recomputation broken on purpose (test/perturbations.py) must change the
# --log. The perturbed trainer is compared with its own run without recomputation.
perturbed() {
    local label=$1 mode=$2
    perturbed_build "$label" || return
    local P=$T/perturbed/train
    # shellcheck disable=SC2086
    $P $D $MODEL $QUIET --threads 2 --recompute none --log "$T/p.none.log" >"$T/p.none.out" 2>&1
    # shellcheck disable=SC2086
    $P $D $MODEL $QUIET --threads 2 --recompute "$mode" --log "$T/p.$mode.log" >"$T/p.$mode.out" 2>&1
    if [ ! -s "$T/p.none.log" ]; then
        fail "perturbation '$label': the run without recomputation failed" "$(tail -2 "$T/p.none.out")"
    elif cmp -s "$T/p.none.log" "$T/p.$mode.log"; then
        fail "perturbation '$label' went unnoticed: the --log is still identical"
    else
        pass "perturbation '$label' is caught: the --log differs ($(cmp "$T/p.none.log" "$T/p.$mode.log" 2>&1 | head -1 | sed 's/.*differ: //'))"
    fi
}
perturbed "selective recomputation skips the GELU" selective
perturbed "full recomputation skips the MLP" full
