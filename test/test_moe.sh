#!/usr/bin/env bash
# Mixture of experts and expert parallelism (llmc/model/moe_block.h, llmc/parallel/ep.h) against the
# single-rank MoE run, on CPU ranks in fp32:
#   - equivalence: 20 steps whose losses, gradient norms and final parameters (the checkpoint
#     each run writes, every tensor, experts and router included) match one rank within 1e-5
#     relative (test/compare_runs.py): ep 2 and 4 with E = 4 and 8, k = 1 and 2, all with tokens
#     dropped (capacity factor 1.0); dp 4 with ep 2; ep 2 x tp 2; ep 2 with ZeRO-1, ZeRO-2 (2
#     micro-steps), ZeRO-2 + offload, naive and the parameter server for the dense part; ep 1
#     (experts replicated: plain data parallelism, also with ZeRO-3); tp 2 alone;
#   - in every such run: every step's counted all-to-all bytes equal the formula from the measured
#     routing, the edp all-reduce's bytes equal its formula, the dense/expert parameter split
#     equals its formula, the data-parallel memory table (and tp's) equal theirs, and the tokens
#     per expert and the drops of every step, summed over the ranks, equal the single-rank run's;
#   - the file: an MoE checkpoint (version 10) written by an ep run loads on one rank and gives
#     the same validation loss; a dense checkpoint still loads as llm.c's;
#   - bad input: ep not dividing E or the dp size, k > E, a dense checkpoint with --moe flags, a
#     truncated MoE checkpoint, an MoE header asking for top-3 of 2 experts,
#     an MoE checkpoint with other --moe flags, --ep without experts, --ep with --zero 3, MoE
#     with --pp: one clear line on every rank, non-zero exit, no hang;
#   - the tests can fail: the trainer with deliberate bugs (test/perturbations.py: expert gradients
#     averaged over all dp ranks; a combine that ignores the gate weights) must fail the
#     equivalence (MOE_PERTURB=0 skips this part).
set -u
cd "$(dirname "$0")/.."
T=build/moe-test
rm -rf "$T"
mkdir -p "$T"
WHAT="expert parallelism"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all, perturb, ref; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 4000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
SHAPE="--layers 3 --heads 4 --channels 64"
# 6 steps: every piece of state crosses a step (AdamW m, v, t, the shards, the data position),
# and the 5-step warmup ends
STEPS=6
RUN="--batch 8 --seq 32 --steps $STEPS --lr 1e-3 --warmup 5"
MODEL="$SHAPE $RUN"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"
E4K1="--moe-experts 4 --moe-topk 1 --moe-every 1 --moe-capacity 1.0"
E4K2="--moe-experts 4 --moe-topk 2 --moe-every 1 --moe-capacity 1.0"
E8K1="--moe-experts 8 --moe-topk 1 --moe-every 2 --moe-capacity 1.0 --moe-aux 0.1"
E8K2="--moe-experts 8 --moe-topk 2 --moe-every 1 --moe-capacity 1.0"

# single-rank references (ref: test/lib_mpi.sh)
ref e4k1 $E4K1
ref e4k2 $E4K2
ref e8k1 $E8K1
ref e8k2 $E8K2
ref e4k2acc $E4K2 --grad-accum 2
ref dense --steps 2
for r in e4k1 e4k2 e8k1 e8k2; do
    dropped=$(grep -c "moe | .*dropped [1-9]" "$T/$r.out")
    [ "$dropped" -eq $STEPS ] || fail "reference $r drops tokens on every step" "$dropped of $STEPS steps drop"
done

# moe lines of a run: the tokens per expert and the drops of every step (the aux loss is the mean
# of per-rank figures and is judged by the loss)
counts() { grep "moe | tokens" "$1" | sed 's/ | aux loss.*//'; }

# check NP REF LABEL FLAGS...: the run against the reference, its counted bytes, memory, counts
check() {
    local refname=$2 label=$3 out="$T/run.out"
    run_vs_ref "$@" || return 1
    local bad="" n
    if grep -q "^expert parallel" "$out"; then
        n=$(grep -c "ep comm | all-to-all sent .*, equal;.*edp all-reduce .*equal)" "$out")
        [ "$n" -eq $STEPS ] || bad="all-to-all or edp bytes = formula in $n of $STEPS steps"
        grep -q "parameters per rank .*equal)" "$out" || bad="$bad dense/expert parameter split"
    fi
    grep -q "^memory check ok" "$out" || bad="$bad data-parallel memory table"
    if grep -q "^tensor parallel" "$out"; then
        grep -q "^tp memory check ok" "$out" || bad="$bad tp memory lines"
        n=$(grep -c "tp comm | sent .* equal)" "$out")
        [ "$n" -eq $STEPS ] || bad="$bad tp bytes = formula in $n of $STEPS steps"
    fi
    [ "$(counts "$out")" = "$(counts "$T/$refname.out")" ] || bad="$bad tokens per expert differ from one rank's"
    if [ -n "$bad" ]; then
        fail "$label: $bad" "$(diff <(counts "$T/$refname.out") <(counts "$out") | head -3)" "$(grep -E 'ep comm \||memory check' "$out" | head -2)"
    else
        local bytes
        bytes=$(grep -m1 'ep comm | all-to-all sent' "$out" | grep -o 'sent *[0-9.]* MiB' | tr -s ' ')
        pass "$label: all-to-all bytes = formula on all $STEPS steps (${bytes:-no ep} at step 1), memory = formula, tokens per expert and drops = one rank's on every step"
    fi
}

check 2 e4k1 "ep 2, E 4, top-1" $E4K1 --ep 2
check 2 e4k2 "ep 2, E 4, top-2" $E4K2 --ep 2
cp "$T/run.bin" "$T/ep2.bin"
check 4 e4k2 "ep 4, E 4, top-2" $E4K2 --ep 4
check 4 e8k1 "ep 4, E 8, top-1, every 2nd block, aux 0.1" $E8K1 --ep 4
check 4 e8k2 "ep 4, E 8, top-2" $E8K2 --ep 4
check 2 e8k2 "ep 2, E 8, top-2" $E8K2 --ep 2
check 2 e8k1 "ep 2, E 8, top-1, every 2nd block, aux 0.1" $E8K1 --ep 2
check 4 e4k1 "ep 4, E 4, top-1" $E4K1 --ep 4
check 4 e4k2 "dp 4 with ep 2" $E4K2 --ep 2
check 4 e4k2 "ep 2 x tp 2" $E4K2 --ep 2 --tp 2
check 4 e4k2 "dp 4 ep 2, ZeRO-1 over the dense part" $E4K2 --ep 2 --zero 1 --bucket-mb 0.1
check 4 e4k2acc "dp 4 ep 2, ZeRO-2, 2 micro-steps" $E4K2 --ep 2 --zero 2 --grad-accum 2
check 2 e4k2 "ep 2, naive all-reduce of the dense part" $E4K2 --ep 2 --dp-mode naive
check 2 e4k2 "ep 2, parameter server for the dense part" $E4K2 --ep 2 --dp-mode ps --ps-servers 1
check 2 e4k2 "ep 2, ZeRO-2 + offload of the dense part" $E4K2 --ep 2 --zero 2 --offload
check 2 e4k2 "ep 1 (dp 2, experts replicated)" $E4K2
check 2 e4k2 "ep 1, ZeRO-3 (experts sharded as dense tensors)" $E4K2 --zero 3
check 2 e4k2 "tp 2 (experts split inside)" $E4K2 --tp 2

# --- the file: the ep 2 run's checkpoint (version 10) on one rank: the same validation loss
val() { grep "^val loss" "$1" | tail -1; }
# shellcheck disable=SC2086
./train_gpt2cpu $D --load "$T/ep2.bin" --steps 1 --lr 0 --eval-every 1 --accuracy 0 --sample-every 0 --batch 8 --seq 32 --threads 1 >"$T/l1.out" 2>&1
# shellcheck disable=SC2086
./train_gpt2cpu $D --load "$T/e4k2.bin" --steps 1 --lr 0 --eval-every 1 --accuracy 0 --sample-every 0 --batch 8 --seq 32 --threads 1 >"$T/l2.out" 2>&1
version=$(python3 -c "import struct,sys; print(struct.unpack('2i', open(sys.argv[1],'rb').read(8))[1])" "$T/ep2.bin")
if [ "$version" = 10 ] && [ -n "$(val "$T/l1.out")" ] && [ "$(val "$T/l1.out")" = "$(val "$T/l2.out")" ] && grep -q "^moe  " "$T/l1.out"; then
    pass "the ep 2 checkpoint (version $version) loads on one rank as an MoE model: $(val "$T/l1.out"), as the single-rank checkpoint"
else
    fail "MoE checkpoint reload" "version $version; $(val "$T/l1.out") vs $(val "$T/l2.out")" "$(tail -2 "$T/l1.out")"
fi
dv=$(python3 -c "import struct,sys; print(struct.unpack('2i', open(sys.argv[1],'rb').read(8))[1])" "$T/dense.bin")
[ "$dv" = 3 ] && pass "a dense model is still written as llm.c's version 3" || fail "dense checkpoint version $dv"

# --- bad input: every rank says what is wrong, all exit non-zero, no hang
expect_all "ep not dividing E" "does not divide the 3 experts" 2 ./train_gpt2cpu $D $MODEL $QUIET --moe-experts 3 --ep 2
expect_all "ep not dividing the dp ranks" "does not divide the 2 data-parallel ranks" 2 ./train_gpt2cpu $D $MODEL $QUIET --moe-experts 4 --ep 4
expect_all "top-k above E" "cannot go to more than the 2 experts" 2 ./train_gpt2cpu $D $MODEL $QUIET --moe-experts 2 --moe-topk 3
expect_all "dense checkpoint with --moe-experts" "is a dense checkpoint" 2 ./train_gpt2cpu $D $QUIET --load "$T/dense.bin" --moe-experts 4 --ep 2
expect_all "MoE checkpoint with other --moe flags" "do not match" 2 ./train_gpt2cpu $D $QUIET --load "$T/ep2.bin" --moe-experts 8 --moe-topk 2 --moe-every 1
# a truncated MoE file, and one whose header asks for top-3 of 2 experts
python3 - "$T/ep2.bin" "$T/trunc.bin" "$T/badk.bin" <<'PYEOF2'
import struct, sys
data = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(data[:len(data) // 2])
h = list(struct.unpack("256i", data[:1024])); h[8], h[9] = 2, 3
open(sys.argv[3], "wb").write(struct.pack("256i", *h) + data[1024:])
PYEOF2
expect_all "truncated MoE checkpoint" "truncated" 2 ./train_gpt2cpu $D $QUIET --load "$T/trunc.bin" --ep 2
expect_all "MoE checkpoint with top-k above E in its header" "invalid mixture of experts in header" 2 ./train_gpt2cpu $D $QUIET --load "$T/badk.bin"
expect_all "--ep without experts" "add --moe-experts" 2 ./train_gpt2cpu $D $MODEL $QUIET --ep 2
expect_all "--ep with ZeRO-3" "--ep with --zero 3 is not built" 2 ./train_gpt2cpu $D $MODEL $QUIET $E4K2 --ep 2 --zero 3
expect_all "MoE with a pipeline" "--pp with a mixture of experts is not built" 2 ./train_gpt2cpu $D $MODEL $QUIET $E4K2 --pp 2 --grad-accum 2

# --- the tests can fail
if [ "${MOE_PERTURB:-1}" != 0 ]; then
    # the deliberate bugs of test/perturbations.py: the expert gradients averaged over all dp
    # ranks (not only the replicas of the same experts); the combine without the gate weights
    perturb "expert gradients averaged over all dp ranks" e4k2 $D $MODEL $QUIET $E4K2 --ep 2
    perturb "a combine that ignores the gate weights" e4k2 $D $MODEL $QUIET $E4K2 --ep 2
fi
