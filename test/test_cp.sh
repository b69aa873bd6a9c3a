#!/usr/bin/env bash
# Context parallelism (llmc/parallel/cp.h) against the single-rank run, on CPU ranks in fp32:
#   - equivalence: 20 steps whose losses, gradient norms and final parameters match one rank
#     within 1e-5 relative (test/compare_runs.py): ring, allgather and alltoall attention with
#     cp 2 and 4, zigzag and plain split; cp 2 x tp 2 (+ SP, + alltoall); dp 2 x cp 2 with every
#     data-parallel mode (naive, DDP, parameter server, ZeRO-1/2/3, ZeRO-2 + offload); pp 2 x cp 2
#     (1F1B, ZB-H1); SFT (loss on answer tokens only) with cp 2; and dp 2 x pp 2 x cp 2 x tp 2
#     (16 ranks, oversubscribed, 3 steps);
#   - in every such run: each step's cp bytes equal the algorithm's formula (--comm-algo ring,
#     so the collectives count too), the attention work (query, key) pairs is equal on every rank
#     with the zigzag split (max/min 1.000) and not with the plain one, the data-parallel memory
#     table matches its formula;
#   - the validation loss through the cp ranks equals one rank's;
#   - bad input: a sequence that does not split (cp, 2 cp for zigzag), heads that do not split
#     for all-to-all, cp that does not divide the ranks, RLVR: a clear message, non-zero exit on
#     every rank, no hang;
#   - the tests can fail: the trainer with deliberate bugs (test/perturbations.py: the merge without the
#     max correction; a ring that skips its last step) must fail the equivalence check
#     (CP_PERTURB=0 skips this part).
set -u
cd "$(dirname "$0")/.."
T=build/cp-test
rm -rf "$T"
mkdir -p "$T"
WHAT="context parallelism"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all, ref, perturb; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 4000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
SFT="--task sft --sft-train $T/data/sft_train_*.bin --sft-val $T/data/sft_val_*.bin"
# 4 heads of 16 channels: tp 2 x alltoall cp 2 splits them; seq 32: zigzag cp 4 has chunks of 4
SHAPE="--layers 4 --heads 4 --channels 64"
# 6 steps: every piece of state crosses a step (AdamW m, v, t, the shards, the data position),
# and the 5-step warmup ends
STEPS=6
RUN="--batch 8 --seq 32 --steps $STEPS --lr 1e-3 --warmup 5"
MODEL="$SHAPE $RUN"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"

ref m1
ref m4 --grad-accum 4
ref sft $SFT --grad-accum 2

# check NP REF LABEL FLAGS...: the run against the reference, and its per-step checks
check() {
    local label=$3 out="$T/run.out" steps=$STEPS
    [[ " $* " == *" --steps 3 "* ]] && steps=3
    run_vs_ref "$1" "$2" "$3" --comm-algo ring "${@:4}" || return 1
    local bad="" n ratio
    grep -q "^memory check ok" "$out" || bad="data-parallel memory table"
    n=$(grep -c "cp comm | sent .* equal) " "$out")
    [ "$n" -eq "$steps" ] || bad="$bad cp bytes = formula in $n of $steps steps"
    if [[ " $* " == *" --tp "* ]]; then
        n=$(grep -c "tp comm | sent .* equal)" "$out")
        [ "$n" -eq "$steps" ] || bad="$bad tp bytes = formula in $n of $steps steps"
    fi
    ratio=$(grep -m1 "attention work per rank" "$out" | sed 's/.*max\/min \([0-9.]*\).*/\1/')
    if [[ " $* " == *" --cp-split plain "* ]] && [[ " $* " != *" alltoall "* ]]; then
        python3 -c "import sys; sys.exit(0 if float('$ratio') > 1.5 else 1)" || bad="$bad plain split's work max/min $ratio (expected > 1.5)"
    else
        [ "$ratio" = "1.000" ] || bad="$bad work per rank max/min $ratio (expected 1.000)"
    fi
    if [ -n "$bad" ]; then
        fail "$label: $bad" "$(grep -E 'memory check|cp comm \||attention work' "$out" | head -3)"
    else
        pass "$label: cp bytes = formula on all $steps steps ($(grep -m1 'cp comm | sent' "$out" | grep -o 'sent *[0-9.]* MiB')), work max/min $ratio"
    fi
}

for algo in ring allgather alltoall; do
    for split in zigzag plain; do
        for cp in 2 4; do check "$cp" m1 "cp $cp, $algo, $split" --cp "$cp" --cp-algo "$algo" --cp-split "$split"; done
    done
done
check 4 m1 "cp 2 x tp 2, ring" --cp 2 --tp 2
check 4 m1 "cp 2 x tp 2 + SP, ring" --cp 2 --tp 2 --sp
check 4 m1 "cp 2 x tp 2, alltoall" --cp 2 --tp 2 --cp-algo alltoall
check 4 m1 "dp 2 x cp 2, ZeRO-2" --cp 2 --dp 2 --zero 2
check 4 m1 "dp 2 x cp 2, DDP, allgather" --cp 2 --dp 2 --cp-algo allgather --bucket-mb 0.05
check 4 m1 "dp 2 x cp 2, naive" --cp 2 --dp 2 --dp-mode naive
check 4 m1 "dp 2 x cp 2, parameter server" --cp 2 --dp 2 --dp-mode ps
check 4 m1 "dp 2 x cp 2, ZeRO-1" --cp 2 --dp 2 --zero 1
check 4 m1 "dp 2 x cp 2, ZeRO-3, alltoall" --cp 2 --dp 2 --zero 3 --cp-algo alltoall
check 4 m1 "dp 2 x cp 2, ZeRO-2 + offload" --cp 2 --dp 2 --zero 2 --offload
check 4 m4 "pp 2 x cp 2, 1F1B" --cp 2 --pp 2 --grad-accum 4
check 4 m4 "pp 2 x cp 2, ZB-H1, plain" --cp 2 --pp 2 --grad-accum 4 --pp-schedule zb-h1 --cp-split plain
check 2 sft "SFT, cp 2" --cp 2 --grad-accum 2 $SFT
ref short --grad-accum 2 --steps 3
check 16 short "dp 2 x pp 2 x cp 2 x tp 2 (16 ranks), 3 steps" --dp 2 --pp 2 --cp 2 --tp 2 --grad-accum 2 --steps 3

# --- the validation loss through the cp ranks
val() { "$@" $D $QUIET --load "$T/m1.bin" --steps 1 --lr 0 --batch 8 --seq 32 2>&1 | grep -m1 "val loss"; }
a=$(val ./train_gpt2cpu); b=$(val $MPIRUN -np 4 ./train_gpt2cpu --cp 4)
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    pass "the validation loss evaluated on 4 cp ranks equals one rank's: '$b'"
else
    fail "validation loss through the cp ranks" "one rank: '$a'" "cp 4: '$b'"
fi

# --- bad input: every rank reports, all exit non-zero, no hang
TRAIN="./train_gpt2cpu $D $MODEL $QUIET"
expect_all "a sequence that does not split over cp (plain)" "is not divisible by 3 (cp blocks)" 3 $TRAIN --cp 3 --cp-split plain --seq 32
expect_all "a sequence that does not split into 2 cp chunks (zigzag)" "is not divisible by 8 (2 cp chunks" 4 $TRAIN --cp 4 --seq 36
expect_all "heads that do not split for all-to-all" "--cp-algo alltoall splits the 4 heads over cp 3" 3 $TRAIN --cp 3 --seq 36 --cp-algo alltoall
expect_all "cp that does not divide the ranks" "does not divide the 3 ranks" 3 $TRAIN --cp 2
expect_all "RLVR with cp" "does not run with --cp" 2 $TRAIN --cp 2 --task rlvr

# --- the tests can fail: deliberate bugs (test/perturbations.py says what each changes) must
# break the equivalence
if [ "${CP_PERTURB:-1}" = "1" ]; then
    # shellcheck disable=SC2086
    perturb "the merge without the max correction" m1 $D $MODEL $QUIET --cp 2
    # shellcheck disable=SC2086
    perturb "a ring that skips its last step" m1 $D $MODEL $QUIET --cp 2
fi
exit 0
