#!/usr/bin/env bash
# The SFT data loader (llmc/data/sft_shards.h) through ./test_sftcpu (built by `make test_sftcpu`; this
# script builds nothing): the unit checks (packing, weights, data-parallel split, count_ahead,
# wrap-around), every malformed input dies with exit 1 and a one-line message naming the file,
# and the SFT output of dev/data/arithmetic.py parses as "<eot>a+b=" + "(a+b)\n".
# Prints PASS/FAIL lines; exits 1 if any failed.
set -u
cd "$(dirname "$0")/.."
T=build/sft-test
mkdir -p "$T"
status=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; status=1; }

if [ ! -x ./test_sftcpu ]; then
    echo "FAIL test_sftcpu is not built (make test_sftcpu)"
    exit 1
fi

# --- unit checks
./test_sftcpu >"$T/unit.log" 2>&1
rc=$?
cat "$T/unit.log"
if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$T/unit.log"; then fail "test_sftcpu exited with status $rc" "$(tail -3 "$T/unit.log")"; fi
grep -q '^FAIL ' "$T/unit.log" && status=1

# --- malformed inputs: exit status 1 and the expected message
B="$T/bad"
rm -rf "$B"
./test_sftcpu --make-bad "$B" >/dev/null || fail "test_sftcpu --make-bad"
# expect_error NAME PATTERN ARGS...: ./test_sftcpu ARGS must exit 1 and print PATTERN on stderr
expect_error() {
    local name=$1 pattern=$2; shift 2
    ./test_sftcpu "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$T/err"; then
        pass "$name: $(head -1 "$T/err")"
    else
        fail "$name" "exit status $rc (want 1), stderr: $(head -2 "$T/err")" "wanted: $pattern"
    fi
}
out=$(./test_sftcpu --load "$B/good_*.bin" 6 1 2>&1)
if [ $? -eq 0 ] && [ "$out" = "2 examples, 0 skipped, 2 rows" ]; then pass "good file set loads: $out"; else fail "good file set" "$out"; fi
expect_error "no files match" "no SFT shards match '$B/none_\*.bin'" --load "$B/none_*.bin" 16 1
expect_error "mask file missing" "SFT loss mask '$B/nomask_000000.mask' for shard '$B/nomask_000000.bin' is missing" --load "$B/nomask_*.bin" 16 1
expect_error "mask with wrong magic" "'$B/badmagic_000000.mask' is not an SFT loss mask: magic 12345, expected 20241123" --load "$B/badmagic_*.bin" 16 1
expect_error "mask with wrong version" "'$B/badversion_000000.mask': mask version 2, expected 1" --load "$B/badversion_*.bin" 16 1
expect_error "token count mismatch" "'$B/count_000000.mask' holds 13 mask values but its shard '$B/count_000000.bin' holds 14 tokens" --load "$B/count_*.bin" 16 1
expect_error "truncated mask" "'$B/truncated_000000.mask' has 1035 bytes, header says 14 values = 1038 bytes: truncated" --load "$B/truncated_*.bin" 16 1
expect_error "mask value not 0/1" "'$B/value_000000.mask': mask value 2 at position 5, expected 0 or 1" --load "$B/value_*.bin" 16 1
expect_error "mask 1 on EOT" "'$B/eotmask_000000.mask': mask 1 on the EOT token at position 7" --load "$B/eotmask_*.bin" 16 1
expect_error "tokens before the first EOT" "'$B/noeot_000000.bin': the shard starts with token 49, not EOT (256): tokens before the first example" --load "$B/noeot_*.bin" 16 1
expect_error "token outside the vocabulary" "'$B/vocab_000000.bin': token 300 at position 3 is outside the model's vocabulary of 257" --load "$B/vocab_*.bin" 16 1
expect_error "empty shard" "no SFT examples in '$B/empty_000000.bin'" --load "$B/empty_*.bin" 16 1
expect_error "shard with wrong magic" "'$B/shardmagic_000000.bin' is not a token shard: magic 777" --load "$B/shardmagic_*.bin" 16 1
expect_error "every example longer than T+1" "every SFT example in '$B/good_\*.bin' is longer than T+1 = 6 tokens (2 skipped)" --load "$B/good_*.bin" 5 1
expect_error "fewer rows than a global micro-batch" "'$B/good_\*.bin' packs into 2 rows of T+1 = 8 tokens, fewer than one global micro-batch needs (2 ranks x 2 rows)" --load "$B/good_*.bin" 7 2 2
out=$(./test_sftcpu --examples "$B/good_*.bin" 2>&1)
if [ $? -eq 0 ] && [ "$out" = "2 examples" ]; then pass "sft_load_examples on the good file set: $out"; else fail "sft_load_examples on the good file set" "$out"; fi
expect_error "examples: prompt token after the answer" "'$B/afteranswer_000000.bin': the example at token 7 has a prompt token (mask 0) after its answer at position 13" --examples "$B/afteranswer_*.bin"
expect_error "examples: no answer" "'$B/noanswer_000000.bin': the example at token 7 has no answer (no mask-1 token)" --examples "$B/noanswer_*.bin"
expect_error "examples: mask file missing" "SFT loss mask '$B/nomask_000000.mask' for shard '$B/nomask_000000.bin' is missing" --examples "$B/nomask_*.bin"

# --- the SFT output of dev/data/arithmetic.py: a fresh small one, and data/arithmetic if present
if command -v python3 >/dev/null; then
    if python3 dev/data/arithmetic.py --out-dir "$T/arith" --num-train 100 --num-val 100 --num-sft-train 3000 --num-sft-val 300 >"$T/arith.log" 2>&1; then
        ./test_sftcpu --check-arith "$T/arith/sft_train_*.bin" || status=1
        ./test_sftcpu --check-arith "$T/arith/sft_val_*.bin" || status=1
    else
        fail "arithmetic.py (SFT output)" "$(tail -2 "$T/arith.log")"
    fi
else
    echo "skipping arithmetic.py's SFT output: python3 not found"
fi
for split in train val; do
    if [ -e "data/arithmetic/sft_${split}_000000.bin" ]; then
        ./test_sftcpu --check-arith "data/arithmetic/sft_${split}_*.bin" || status=1
    else
        echo "skipping data/arithmetic/sft_${split}_000000.bin: not there (python3 dev/data/arithmetic.py writes it)"
    fi
done
exit $status
