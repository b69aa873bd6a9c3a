#!/usr/bin/env bash
# Gradient compression (llmc/parallel/dp_compress.h, its codec compress_codec.h), on CPU ranks in fp32:
#   - the codec (./test_compresscpu): QSGD unbiased with its variance, top-k picks the largest,
#     random-k's shared indices, the bit packing, error feedback's exactness, the payload sizes;
#     and a copy built with QSGD always rounding down must FAIL it;
#   - ratio 1 bit for bit: --compress topk:1 and randk:1 give the same --log file and the same
#     --save checkpoint (cmp) as the run without --compress, for naive, ddp (2 buckets) and the
#     parameter server (1 and 2 servers), on 3 ranks (where the order of the additions matters);
#   - every method (topk, randk, qsgd, sign) in every mode: every step's counted bytes equal
#     the compressed formula on every rank, the memory table still checks, and error
#     feedback's conservation holds on every value every step;
#   - a copy built without the residual update must report the conservation FAILED;
#   - bad input on 2 ranks: a clear message on every rank, non-zero exit, no hang.
set -u
cd "$(dirname "$0")/.."
T=build/compress-test
rm -rf "$T"
mkdir -p "$T"
WHAT="gradient compression"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all, perturbed_build

# --- the codec
if ./test_compresscpu >"$T/unit.out" 2>&1; then
    grep '^PASS' "$T/unit.out"
else
    grep '^PASS' "$T/unit.out"
    fail "codec unit test (./test_compresscpu)" "$(grep '^FAIL' "$T/unit.out" | head -5)"
fi
# the same test built from a copy where QSGD rounds down always: biased, so it must fail
rm -rf "$T/pq" && mkdir -p "$T/pq/test" && cp -r llmc "$T/pq/" && cp test/test_compress.cu "$T/pq/test/"
if python3 - "$T/pq/llmc/parallel/compress_codec.h" <<'EOF' && g++ -std=c++17 -O2 -x c++ -DLLMC_CPU "$T/pq/test/test_compress.cu" -o "$T/pq/t" -lm; then
import sys
p = sys.argv[1]; s = open(p).read(); old = "(u < c - l ? 1u : 0u)"
if old not in s: sys.exit(1)
open(p, "w").write(s.replace(old, "0u"))
EOF
    if "$T/pq/t" >"$T/pq.out" 2>&1; then
        fail "perturbation 'QSGD rounds down always' went unnoticed by the codec test"
    else
        pass "perturbation 'QSGD rounds down always' fails the codec test: $(grep -m1 '^FAIL' "$T/pq.out" | cut -c6-120)"
    fi
else
    fail "perturbation 'QSGD rounds down always': text not found or build failed"
fi

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 4000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
# 3 layers of C 64 (Psi = 178,752): --bucket-mb 0.4 gives DDP 2 buckets
STEPS=5
MODEL="--layers 3 --heads 2 --channels 64 --batch 24 --seq 32 --steps $STEPS --lr 1e-3 --warmup 5"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"
TRAIN="./train_gpt2cpu $D $MODEL $QUIET"
MODES=("naive|--dp-mode naive"
       "ddp, 2 buckets|--bucket-mb 0.4"
       "parameter server, 1 server|--dp-mode ps --ps-servers 1"
       "parameter server, 2 servers|--dp-mode ps --ps-servers 2")

# run NAME NP FLAGS...: $T/NAME.{out,log,bin}; returns 1 (after a FAIL) when the run fails
run() {
    local name=$1 np=$2; shift 2
    # shellcheck disable=SC2086
    if ! $MPIRUN -np "$np" $TRAIN "$@" --log "$T/$name.log" --save "$T/$name.bin" >"$T/$name.out" 2>&1; then
        fail "$name: the run failed" "$(grep -v '^\s*$' "$T/$name.out" | tail -3)"
        return 1
    fi
}

# --- ratio 1 reproduces the uncompressed run bit for bit
for entry in "${MODES[@]}"; do
    name=${entry%%|*}
    flags=${entry#*|}
    # shellcheck disable=SC2086
    run ref 3 $flags || continue
    for c in topk:1 randk:1; do
        # shellcheck disable=SC2086
        run one 3 $flags --compress $c || continue
        if cmp -s "$T/ref.log" "$T/one.log" && cmp -s "$T/ref.bin" "$T/one.bin"; then
            pass "3 ranks, $name: --compress $c gives the uncompressed run's log and checkpoint bit for bit"
        else
            fail "3 ranks, $name: --compress $c differs from the uncompressed run" "$(cmp "$T/ref.log" "$T/one.log"; cmp "$T/ref.bin" "$T/one.bin")"
        fi
    done
done

# --- every method in every mode: bytes = formula and the conservation, every step
# checks NAME: the per-step lines of $T/NAME.out ($1: 1 when error feedback is on)
checks() {
    local name=$1 ef=$2 tag=$3 n ok=1
    n=$(grep -c "comm | sent .* equal)" "$T/$name.out")
    [ "$n" -eq $STEPS ] || { fail "$tag: counted bytes = formula in $n of $STEPS steps" "$(grep -m2 'comm |' "$T/$name.out")"; ok=0; }
    n=$(grep -c "compress | bytes = formula on all ranks" "$T/$name.out")
    [ "$n" -eq $STEPS ] || { fail "$tag: bytes = formula on every rank in $n of $STEPS steps" "$(grep -m2 ' compress |' "$T/$name.out")"; ok=0; }
    grep -q "memory check ok" "$T/$name.out" || { fail "$tag: memory table" "$(grep -A8 'memory per rank' "$T/$name.out")"; ok=0; }
    if [ "$ef" = on ]; then
        n=$(grep -c "error feedback: sent + residual = accumulated exactly on all\|error feedback: residual = fl(accumulated - sent), |accumulated - (sent + residual)| <= ulp(residual)/2 on all" "$T/$name.out")
        [ "$n" -eq $STEPS ] || { fail "$tag: error feedback conserved in $n of $STEPS steps" "$(grep -m2 ' compress |' "$T/$name.out")"; ok=0; }
    fi
    return $((1 - ok))
}
for entry in "${MODES[@]}"; do
    name=${entry%%|*}
    flags=${entry#*|}
    good=""
    for c in topk:0.1 randk:0.05 qsgd:4 sign; do
        # shellcheck disable=SC2086
        run m 3 $flags --compress $c || continue
        checks m on "3 ranks, $name, --compress $c" && good="$good $c"
    done
    # shellcheck disable=SC2086
    run m 3 $flags --compress qsgd:2 --error-feedback off && checks m off "3 ranks, $name, qsgd:2, error feedback off" && good="$good qsgd:2/off"
    pass "3 ranks, $name:$good: counted bytes = formula every step on every rank, memory check ok, error feedback conserved every step"
done
# what the lines say, once (for the log)
grep -m1 "^compress     this rank" "$T/m.out" | sed 's/^/     /'
grep -m1 "^ compress |" "$T/m.out" | sed 's/^/     /'

# --- the trainer without the residual update (e = 0; test/perturbations.py): the conservation
# check must fail
if perturbed_build "no residual update"; then
    $MPIRUN -np 2 "$T/perturbed/train" $D $MODEL $QUIET --compress qsgd:4 >"$T/p.out" 2>&1
    n=$(grep -c "error feedback: sent + residual = accumulated exactly on all" "$T/p.out")
    if [ "$n" -eq 0 ] && grep -q "CONSERVATION FAILED" "$T/p.out"; then
        pass "perturbation 'no residual update' is reported: $(grep -m1 -o 'CONSERVATION FAILED on [0-9]* of [0-9]* values' "$T/p.out")"
    else
        fail "perturbation 'no residual update' went unnoticed" "$(grep -m2 ' compress |' "$T/p.out")"
    fi
fi

# --- a copy that adds the decoded values in another order (d_b first instead of d_{b+1}): ratio 1
# must then differ from the ring's sums (the bit-for-bit check above sees the order)
if perturbed_build "sum in another order"; then
    run ref 3 --dp-mode naive
    $MPIRUN -np 3 "$T/perturbed/train" $D $MODEL $QUIET --dp-mode naive --compress topk:1 --log "$T/p.log" --save "$T/p.bin" >"$T/p.out" 2>&1
    if cmp -s "$T/ref.log" "$T/p.log" && cmp -s "$T/ref.bin" "$T/p.bin"; then
        fail "perturbation 'sum in another order' went unnoticed by the bit-for-bit check"
    else
        pass "perturbation 'sum in another order' breaks ratio 1's bit-for-bit match: $(cmp "$T/ref.bin" "$T/p.bin" 2>&1 | head -1)"
    fi
fi

# --- bad input: every rank says why, no hang
expect_all "--compress topk:0" "the ratio R (the fraction of values sent) must be in (0, 1]" 2 $TRAIN --compress topk:0
expect_all "--compress randk:1.5" "the ratio R (the fraction of values sent) must be in (0, 1]" 2 $TRAIN --compress randk:1.5
expect_all "--compress qsgd:0" "B must be 1 to 16 bits" 2 $TRAIN --compress qsgd:0
expect_all "--compress qsgd:17" "B must be 1 to 16 bits" 2 $TRAIN --compress qsgd:17
expect_all "--compress with --zero 2" "not --zero 2" 2 $TRAIN --compress sign --zero 2
expect_all "--compress gzip" "--compress must be none, topk:R, randk:R, qsgd:B or sign" 2 $TRAIN --compress gzip
