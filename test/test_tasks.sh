#!/usr/bin/env bash
# The training tasks through the trainer (doc/training-tasks.md):
#   - SFT and RLVR with data parallelism against the single-rank run of the same math
#     (test/compare_runs.py: loss, gradient norm, final parameters within 1e-5);
#   - SFT's packing report (an example longer than --seq is skipped and counted);
#   - the RLVR metrics file;
#   - bad input: a message, a non-zero exit, no hang;
#   - the lab script (scripts/lab_tasks.sh) in miniature: its stages, CSV and report.
# The model: a 2-layer model pre-trained for 100 steps here, so that rollouts get rewards
# (exact+format: the format reward is non-zero long before the answers are right).
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
PY=${PYTHON:-python3}   # compare_runs.py and data_common need only the standard library
dir=build/tasks-test
rm -rf "$dir"
mkdir -p "$dir"
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

# ---- a small pre-trained model
./train_gpt2cpu --layers 2 --channels 64 --heads 4 --steps 100 --eval-every 0 --accuracy 0 --sample-every 0 \
    --save "$dir/pre.bin" >"$dir/pre.out" 2>&1 || { fail "pre-training the test model (see $dir/pre.out)"; exit 1; }

have_mpi=1
command -v mpirun >/dev/null || have_mpi=0
common="--load $dir/pre.bin --warmup 0 --eval-every 0 --accuracy 0 --sample-every 0 --threads 1"

# run NAME NP ARGS...: one training run, log and checkpoint under $dir/NAME
run() {
    local name=$1 np=$2; shift 2
    if [ "$np" -eq 1 ]; then
        ./train_gpt2cpu $common "$@" --log "$dir/$name.log" --save "$dir/$name.bin" >"$dir/$name.out" 2>&1
    else
        timeout 300 $MPIRUN -np "$np" ./train_gpt2cpu $common "$@" --log "$dir/$name.log" --save "$dir/$name.bin" >"$dir/$name.out" 2>&1
    fi
}
# same REF RUN LABEL [compare_runs flags]: the run equals the reference run
same() {
    local ref=$1 name=$2 label=$3; shift 3
    if out=$("$PY" test/compare_runs.py "$dir/$ref.log" "$dir/$ref.bin" "$dir/$name.log" "$dir/$name.bin" \
             --label "$label" "$@" 2>&1); then echo "$out"; else echo "$out" | grep -q '^FAIL' && echo "$out" || echo "FAIL $label: $out"; fails=$((fails + 1)); fi
}

# ---- SFT: loss on the answer tokens, normalised by their number over the whole step
sft="--task sft --steps 8 --lr 1e-3 --batch 12 --seq 32"
if run sft1 1 $sft && run sft1acc 1 $sft --grad-accum 2; then
    pass "sft: single-rank runs (micro-steps 1 and 2)"
    grep -q "examples packed into" "$dir/sft1.out" && pass "sft: packing reported" || fail "sft: no packing line"
    same sft1 sft1acc "sft: 2 micro-steps = 1"
    if [ $have_mpi = 1 ]; then
        run sft_dp2 2 $sft && same sft1 sft_dp2 "sft: 2 ranks (DDP) = 1 rank" || fail "sft: 2-rank run failed (see $dir/sft_dp2.out)"
        run sft_dp3 3 $sft --grad-accum 2 --zero 2 && same sft1 sft_dp3 "sft: 3 ranks, ZeRO-2, 2 micro-steps = 1 rank" \
            || fail "sft: 3-rank run failed (see $dir/sft_dp3.out)"
        # --shuffle: every rank draws the same row order from --seed
        if run sft1_shuf 1 $sft --shuffle && run sft_dp2_shuf 2 $sft --shuffle; then
            same sft1_shuf sft_dp2_shuf "sft --shuffle: 2 ranks (DDP) = 1 rank"
            cmp -s "$dir/sft1.log" "$dir/sft1_shuf.log" && fail "sft --shuffle: the same losses as file order" \
                || pass "sft --shuffle: another order than the file's (different losses)"
        else
            fail "sft --shuffle: a run failed (see $dir/sft1_shuf.out, $dir/sft_dp2_shuf.out)"
        fi
    fi
else
    fail "sft: single-rank run failed (see $dir/sft1.out)"
fi
# an example longer than the sequence: skipped and counted (on the plain format, whose examples
# are 7-11 tokens long: the default format's are all 11)
python3 dev/data/arithmetic.py --format plain --out-dir "$dir/plain" --num-train 100 --num-val 100 \
    --num-sft-train 2000 --num-sft-val 100 >/dev/null
if ./train_gpt2cpu $common --task sft --steps 1 --batch 4 --seq 8 --sft-train "$dir/plain/sft_train_*.bin" \
        --sft-val "$dir/plain/sft_val_*.bin" >"$dir/sft_short.out" 2>&1 &&
   grep -E "examples packed into .* rows of 9 tokens, [1-9][0-9]* skipped" "$dir/sft_short.out" >/dev/null; then
    pass "sft: examples longer than --seq + 1 tokens are skipped and counted ($(grep -o '[0-9]* skipped' "$dir/sft_short.out"))"
else
    fail "sft: --seq 8 should skip and count the long examples (see $dir/sft_short.out)"
fi

# ---- RLVR: rollouts split over ranks, rewards gathered, global group statistics
rl="--task rlvr --steps 5 --lr 1e-3 --batch 16 --group 4 --reward exact+format"
if run rl1 1 $rl --kl 0.1 --metrics "$dir/rl1.csv"; then
    pass "rlvr: single-rank run (GRPO, KL 0.1)"
    if [ "$(head -1 "$dir/rl1.csv")" = "step,reward,accuracy,length,kl,loss,heldout_accuracy" ] &&
       [ "$(wc -l <"$dir/rl1.csv")" -eq 6 ]; then pass "rlvr: metrics file (header + 5 steps)"; else fail "rlvr: metrics file"; fi
    grep -q "nan" "$dir/rl1.out" && fail "rlvr: a NaN in the output" || pass "rlvr: no NaN (groups where every sample scores the same give A = 0)"
    if [ $have_mpi = 1 ]; then
        run rl_dp2 2 $rl --kl 0.1 && same rl1 rl_dp2 "rlvr: 2 ranks (DDP) = 1 rank, GRPO + KL" --loss-floor 1 \
            || fail "rlvr: 2-rank run failed (see $dir/rl_dp2.out)"
        run rl_dp4 4 $rl --kl 0.1 --zero 3 --grad-accum 2 && same rl1 rl_dp4 "rlvr: 4 ranks, ZeRO-3, 2 micro-steps = 1 rank, GRPO + KL" --loss-floor 1 \
            || fail "rlvr: 4-rank run failed (see $dir/rl_dp4.out)"
    fi
else
    fail "rlvr: single-rank run failed (see $dir/rl1.out)"
fi
if run rlb1 1 $rl --rl-mode baseline && { [ $have_mpi = 0 ] || run rlb2 2 $rl --rl-mode baseline; }; then
    [ $have_mpi = 1 ] && same rlb1 rlb2 "rlvr: 2 ranks = 1 rank, running-mean baseline" --loss-floor 1
else
    fail "rlvr: baseline runs failed (see $dir/rlb*.out)"
fi
top1="--task rlvr --steps 4 --lr 1e-3 --batch 8 --group 1 --rl-mode top1 --reward exact+format"
if run rlt1 1 $top1 && { [ $have_mpi = 0 ] || run rlt2 2 $top1; }; then
    [ $have_mpi = 1 ] && same rlt1 rlt2 "rlvr: 2 ranks = 1 rank, top-1 (the lecture's r * log p)" --loss-floor 1
    grep -q "greedy (top-1)" "$dir/rlt1.out" && pass "rlvr: top1 mode samples greedily" || fail "rlvr: top1 mode is not greedy"
else
    fail "rlvr: top1 runs failed (see $dir/rlt*.out)"
fi

# ---- bad input: message, non-zero exit, no hang
printf '' >"$dir/empty.txt"
"$PY" - "$dir" <<'EOF'
import sys, os
sys.path.insert(0, "dev/data")
from data_common import write_shard, write_mask
from array import array
d = sys.argv[1]
write_shard(os.path.join(d, "empty_000000.bin"), array("H"))
write_mask(os.path.join(d, "empty_000000.mask"), array("B"))
EOF
bad() {   # bad LABEL EXPECTED-MESSAGE ARGS...
    local label=$1 want=$2; shift 2
    timeout 60 ./train_gpt2cpu $common "$@" >"$dir/bad.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$want" "$dir/bad.out"; then pass "bad input: $label -> '$want', exit $rc"
    else fail "bad input: $label (exit $rc, want '$want'): $(tail -2 "$dir/bad.out")"; fi
}
bad "empty prompt file" "no SFT examples" --task rlvr --steps 1 --batch 8 --group 4 --prompts "$dir/empty_*.bin"
bad "empty SFT file" "no SFT examples" --task sft --steps 1 --batch 4 --sft-train "$dir/empty_*.bin"
bad "every SFT example too long" "longer than" --task sft --steps 1 --batch 4 --seq 4
bad "--shuffle without --task sft" "needs --task sft" --shuffle --steps 1 --batch 4
bad "unknown task" "--task must be" --task finetune
bad "unknown reward" "unknown reward function" --task rlvr --reward exact+speed
bad "unknown RL mode" "--rl-mode must be" --task rlvr --rl-mode ppo
bad "batch not a multiple of the group" "not a multiple of --group" --task rlvr --batch 10 --group 4
bad "grpo with a group of one" "--group must be >= 2" --task rlvr --batch 8 --group 1
bad "top1 with a group" "use --group 1" --task rlvr --rl-mode top1 --batch 8 --group 4
bad "negative KL" "--kl must be >= 0" --task rlvr --kl -1
bad "prompt + completion longer than --seq" "too short for the longest prompt" --task rlvr --batch 8 --group 4 --seq 8 --max-new 8

# ---- the lab script end to end, in miniature (scripts/lab_tasks.sh: the stages, the controls,
#      the CSV and the report), with one shared base and with a base per seed
lab() {   # lab LABEL BASE_SEED WANT-BASES: run the lab for seeds 1 2, check its CSV and report
    local label=$1 base=$2 want=$3 out="$dir/lab_$2"
    if ! SEEDS="1 2" BASE_SEED=$base PRE_STEPS=20 SFT_STEPS=4 RL_STEPS=3 EXAMPLES=20 THREADS=1 OUT="$out" \
            MODEL_FLAGS="--layers 2 --heads 4 --channels 64" RL_BATCH=16 \
            timeout 300 bash scripts/lab_tasks.sh >"$out.out" 2>&1; then
        fail "lab ($label): the script failed: $(tail -2 "$out.out")"; return
    fi
    local header rows bases shared
    header=$(head -1 "$out/accuracy.csv")
    rows=$(tail -n +2 "$out/accuracy.csv" | awk -F, 'NF == 7 && $3 ~ /^[0-9.]+$/ && $7 ~ /^[0-9.]+$/' | wc -l)
    bases=$(tail -n +2 "$out/accuracy.csv" | cut -d, -f2 | tr '\n' ' ')
    shared=$(tail -n +2 "$out/accuracy.csv" | cut -d, -f3 | sort -u | wc -l)
    if [ "$header" = "seed,base_seed,pretrain,pretrain_more,sft,sft_more,rlvr" ] && [ "$rows" -eq 2 ] &&
       [ "$bases" = "$want" ] && grep -q "^| SFT more (control)" "$out/results.md" &&
       grep -q "^- RLVR vs SFT more" "$out/results.md" && grep -q "^- paired gain RLVR - SFT:" "$out/results.md" &&
       { [ "$base" = each ] || { [ "$shared" -eq 1 ] && grep -q "one base model, seed $base" "$out/results.md"; }; }; then
        pass "lab ($label): 2 seeds x 5 stages in accuracy.csv, bases '$want', the report"
    else
        fail "lab ($label): header '$header', $rows good rows, bases '$bases' (want '$want'), see $out"
    fi
}
lab "one base" 1 "1 1 "
lab "a base per seed" each "1 2 "

echo "task tests: $fails failed"
[ $fails -eq 0 ]
