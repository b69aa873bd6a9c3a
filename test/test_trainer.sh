#!/usr/bin/env bash
# The trainer end to end on a small model: bad input gives a one-line error and exit 1 (never
# a crash), checkpoints reload bit-exactly, runs are deterministic, gradient accumulation
# equals the big batch, and a bf16 (version 5) llm.c checkpoint loads.
set -u
cd "$(dirname "$0")/.."
T=build/trainer-test
rm -rf "$T"
mkdir -p "$T"
python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
SMALL="--layers 2 --heads 2 --channels 32 --max-seq 32 --batch 4 --seq 16 --eval-every 0 --accuracy 0 --sample-every 0 --threads 2"
TRAIN="./train_gpt2cpu $D $SMALL"

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; }

# expect_error NAME PATTERN CMD...: CMD must exit with status 1 and print PATTERN on stderr
expect_error() {
    local name=$1 pattern=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$T/err"; then
        pass "$name: $(head -1 "$T/err")"
    else
        fail "$name" "exit status $rc (want 1), stderr: $(head -2 "$T/err")" "wanted: $pattern"
    fi
}

# --- flags
if ./train_gpt2cpu --help | grep -q -- "--grad-accum"; then pass "--help lists the flags"; else fail "--help"; fi
expect_error "unknown flag" "unknown flag '--bogus'" $TRAIN --bogus 3
expect_error "missing value" "flag '--steps' needs a value" $TRAIN --steps
expect_error "non-numeric value" "flag '--lr' expects a number, got 'abc'" $TRAIN --lr abc
expect_error "non-integer value" "flag '--batch' expects an integer, got '4.5'" $TRAIN --batch 4.5
expect_error "zero batch" "\-\-batch must be positive" $TRAIN --batch 0
expect_error "negative steps" "\-\-steps must be positive" $TRAIN --steps -1
expect_error "batch not divisible by grad-accum" "\-\-batch 4 is not divisible by --grad-accum 3" $TRAIN --grad-accum 3
expect_error "sequence above the model maximum" "\-\-seq 64 exceeds the model's maximum sequence length 32" $TRAIN --seq 64
expect_error "unknown model" "unknown --model 'gpt5'" $TRAIN --model gpt5
expect_error "heads do not divide channels" "channels (32) must be divisible by heads (3)" $TRAIN --heads 3

# --- token shards
expect_error "no shards" "no token shards match" ./train_gpt2cpu $SMALL --train-data "$T/nothing_*.bin"
python3 - "$T" <<'EOF'
import struct, sys
d = sys.argv[1]
good = open(f"{d}/data/val_000000.bin", "rb").read()
open(f"{d}/bad_magic.bin", "wb").write(struct.pack("<i", 1234) + good[4:])
open(f"{d}/bad_version.bin", "wb").write(good[:4] + struct.pack("<i", 7) + good[8:])
open(f"{d}/truncated.bin", "wb").write(good[: len(good) - 100])
# a valid shard with only 20 tokens: fewer than one batch (4 x 16 + 1)
hdr = struct.pack("<3i", 20240520, 1, 20) + b"\0" * (1024 - 12)
open(f"{d}/short.bin", "wb").write(hdr + struct.pack("<20H", *([65] * 20)))
# a token (300) outside the byte vocabulary of 257
hdr = struct.pack("<3i", 20240520, 1, 100) + b"\0" * (1024 - 12)
open(f"{d}/badtoken.bin", "wb").write(hdr + struct.pack("<100H", *([65] * 99 + [300])))
EOF
expect_error "shard with wrong magic" "bad_magic.bin' is not a token shard: magic 1234, expected 20240520" $TRAIN --train-data "$T/bad_magic.bin"
expect_error "shard with wrong version" "bad_version.bin': shard version 7, expected 1" $TRAIN --train-data "$T/bad_version.bin"
expect_error "truncated shard" "truncated.bin' has .* bytes, header says .*: truncated" $TRAIN --train-data "$T/truncated.bin"
expect_error "shard smaller than one batch" "short.bin' has 20 tokens, fewer than one batch needs" $TRAIN --train-data "$T/short.bin"
expect_error "token outside the vocabulary" "badtoken.bin': token 300 at position 99 is outside the model's vocabulary of 257" $TRAIN --train-data "$T/badtoken.bin"

# --- checkpoints: save, reload bit-exactly, determinism
$TRAIN --steps 4 --save "$T/a.bin" >"$T/run_a.log" 2>&1 || fail "training run" "$(tail -3 "$T/run_a.log")"
$TRAIN --steps 4 --save "$T/a2.bin" >"$T/run_a2.log" 2>&1
if cmp -s "$T/a.bin" "$T/a2.bin" && [ "$(grep '^step' "$T/run_a.log" | cut -d'|' -f1-3)" = "$(grep '^step' "$T/run_a2.log" | cut -d'|' -f1-3)" ]; then
    pass "two runs with the same seed: identical losses and identical checkpoints"
else
    fail "determinism" "checkpoints or losses differ between two identical runs"
fi
./train_gpt2cpu $D --load "$T/a.bin" --batch 4 --seq 16 --steps 1 --lr 0 --weight-decay 0 --eval-every 0 --accuracy 0 --sample-every 0 --save "$T/b.bin" >"$T/run_b.log" 2>&1
if cmp -s "$T/a.bin" "$T/b.bin"; then
    pass "checkpoint reloads bit-exactly (load, one step at lr 0, save: identical bytes)"
else
    fail "checkpoint round trip" "$(tail -2 "$T/run_b.log")"
fi
if [ ! -e "$T/a.bin.tmp" ] && [ ! -e "$T/b.bin.tmp" ]; then pass "no .tmp file left after saving"; else fail "a .tmp file was left behind"; fi
expect_error "save into a missing directory (checked before training)" "\-\-save '$T/no/such/dir/c.bin': the directory '$T/no/such/dir' does not exist" $TRAIN --steps 1 --save "$T/no/such/dir/c.bin"
if [ ! -e "$T/no/such/dir/c.bin" ]; then pass "failed save leaves no file"; else fail "failed save left a file"; fi

python3 - "$T" <<'EOF'
import struct, sys
d = sys.argv[1]
good = open(f"{d}/a.bin", "rb").read()
open(f"{d}/ck_magic.bin", "wb").write(struct.pack("<i", 5) + good[4:])
open(f"{d}/ck_version.bin", "wb").write(good[:4] + struct.pack("<i", 4) + good[8:])
open(f"{d}/ck_trunc.bin", "wb").write(good[: len(good) // 2])
# the same model as an llm.c bf16 checkpoint (version 5): the upper 16 bits of every float
n = (len(good) - 1024) // 4
vals = struct.unpack(f"<{n}I", good[1024:])
open(f"{d}/ck_bf16.bin", "wb").write(good[:4] + struct.pack("<i", 5) + good[8:1024] +
                                     struct.pack(f"<{n}H", *[v >> 16 for v in vals]))
EOF
LOAD="./train_gpt2cpu $D --batch 4 --seq 16 --steps 1 --eval-every 0 --accuracy 0 --sample-every 0"
expect_error "checkpoint with wrong magic" "ck_magic.bin' is not a model checkpoint: magic 5, expected 20240326" $LOAD --load "$T/ck_magic.bin"
expect_error "checkpoint with wrong version" "ck_version.bin': checkpoint version 4, expected 3 (fp32), 5 (bf16) or 10 (mixture of experts, fp32)" $LOAD --load "$T/ck_version.bin"
expect_error "truncated checkpoint" "ck_trunc.bin': header says .*, which need .* bytes, but the file has .* (truncated)" $LOAD --load "$T/ck_trunc.bin"
expect_error "--load with a shape flag" "\-\-load takes the model's shape from the checkpoint" $LOAD --load "$T/a.bin" --layers 3
expect_error "missing checkpoint" "cannot open '$T/missing.bin'" $LOAD --load "$T/missing.bin"
if $LOAD --load "$T/ck_bf16.bin" >"$T/run_bf16.log" 2>&1 && grep -q "^step    1/1" "$T/run_bf16.log"; then
    pass "an llm.c bf16 (version 5) checkpoint loads and trains"
else
    fail "bf16 checkpoint" "$(tail -2 "$T/run_bf16.log")"
fi

# --- samples: drawn through the KV cache, min(--sample-len, --seq - 1) tokens from end-of-text;
# without a tokenizer they print as token ids. Greedy (--top-k 1) twice gives the same sample.
SAMPLE="$TRAIN --tokenizer $T/none.bin --sample-every 1 --steps 2 --top-k 1"   # a later flag wins
$SAMPLE --sample-len 40 >"$T/sample1.log" 2>&1; rc1=$?
$SAMPLE --sample-len 40 >"$T/sample2.log" 2>&1; rc2=$?
n=$(grep '^sample: ' "$T/sample1.log" | tail -1 | sed 's/^sample: //' | wc -w)
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$n" -eq 15 ] && grep -q '^sample: ' "$T/sample1.log" &&
   cmp -s <(grep '^sample: ' "$T/sample1.log") <(grep '^sample: ' "$T/sample2.log"); then
    pass "samples: 15 tokens (--sample-len 40, --seq 16), greedy samples repeat"
else
    fail "samples" "exit $rc1/$rc2, $n tokens in the last sample (want 15)" "$(grep '^sample: ' "$T/sample1.log" | tail -1)"
fi

# --- gradient accumulation: 2 micro-steps of 4 == 1 step of 8 (same sequences, same mean loss),
# judged as every parallel run is (test/compare_runs.py: losses, gradient norms and each tensor
# within 1e-5, norm-wise; the key bias, whose gradient is rounding noise, printed, not judged)
$TRAIN --batch 8 --grad-accum 1 --steps 5 --save "$T/acc1.bin" --log "$T/acc1.txt" >"$T/acc1.log" 2>&1
$TRAIN --batch 8 --grad-accum 2 --steps 5 --save "$T/acc2.bin" --log "$T/acc2.txt" >"$T/acc2.log" 2>&1
python3 test/compare_runs.py "$T/acc1.txt" "$T/acc1.bin" "$T/acc2.txt" "$T/acc2.bin" --label "gradient accumulation 2 x 4 == 1 x 8"

# --- under mpirun the ranks train data-parallel (test/test_dp.sh checks the modes in depth)
if [ -n "$(command -v mpirun)" ] && strings ./train_gpt2cpu | grep -q MPI_Init; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 --oversubscribe $TRAIN --steps 2 >"$T/mpi.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "data parallel bucketed DDP on 2 ranks" "$T/mpi.log" && [ "$(grep -c '^step' "$T/mpi.log")" -eq 2 ]; then
        pass "mpirun -np 2: data-parallel training, one voice (rank 0 prints the 2 step lines)"
    else
        fail "mpirun -np 2" "exit $rc" "$(tail -3 "$T/mpi.log")"
    fi
fi
exit 0
