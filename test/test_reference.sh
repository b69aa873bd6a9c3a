#!/usr/bin/env bash
# The model against PyTorch: write a small model and two batches (test_gpt2cpu), compute the
# reference with test/reference/gpt2.py, compare (test_gpt2cpu --check). The RLVR loss: two
# rollout cases against test/reference/rlvr.py. Mixture of experts: the reference's
# MoE block checks itself first (gpt2.py --self-test: routing rules, gradients against finite
# differences in float64), then four MoE models (moe_a: tokens dropped, moe_b, moe_c, moe_d: exact ties) go through
# the same pipeline.
# bf16 (./test_gpt2cpu only): the CPU backend storing bf16 (test_gpt2cpu --check DIR --precision
# bf16, llmc/cpu/memory.h) against the bf16 reference (gpt2.py --dtype bfloat16: bf16 storage,
# fp32 math in each kernel, fp32 master weights), the dense model and the masked batch, with
# the CUDA bf16 build's tolerances; the RLVR cases against their fp32 reference.
# On a GPU machine: bash test/test_reference.sh ./test_gpt2cu   (the same pipeline with the
# CUDA build, in its own directory; its --check adds the determinism check)
set -u
cd "$(dirname "$0")/.."
bin=${1:-./test_gpt2cpu}
dir=build/reference
if [ "$bin" != "./test_gpt2cpu" ]; then dir=build/reference_$(basename "$bin"); fi
mkdir -p "$dir"

# a Python that has torch: $PYTHON, python3 on PATH, or Debian's /usr/bin/python3
py=""
# (found without importing them: importing torch takes seconds, and jobs.py does it once)
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import importlib.util as u, sys
sys.exit(not (u.find_spec('torch') and u.find_spec('numpy')))" >/dev/null 2>&1; then py=$cand; break; fi
done
if [ -z "$py" ]; then
    echo "FAIL PyTorch is not importable by python3 or /usr/bin/python3: install it with"
    echo "     'apt-get install python3-torch' (or run scripts/install_deps.sh)"
    exit 1
fi
echo "reference python: $py"
"$bin" --write-inputs "$dir" || exit 1
# every reference in one Python process (test/reference/jobs.py: torch imported once), each
# computed once for the same inputs (kept in build/reference-cache under a hash of the inputs)
jobs=("gpt2.py --self-test"
      "gpt2.py --model $dir/model.bin --batch $dir/batch.bin --out $dir/ref.bin"
      "gpt2.py --model $dir/model.bin --batch $dir/batch_masked.bin --out $dir/ref_masked.bin")
for m in moe_a moe_b moe_c moe_d; do
    jobs+=("gpt2.py --model $dir/${m}_model.bin --batch $dir/batch.bin --out $dir/${m}_ref.bin")
done
jobs+=("gpt2.py --model $dir/moe_a_model.bin --batch $dir/batch_masked.bin --out $dir/moe_a_ref_masked.bin")
for case in rl_grpo_kl rl_top1; do
    jobs+=("rlvr.py --model $dir/model.bin --ref-model $dir/ref_model.bin --case $dir/$case.bin --out $dir/${case}_ref.bin")
done
if [ "$bin" = "./test_gpt2cpu" ]; then
    jobs+=("gpt2.py --model $dir/model.bin --batch $dir/batch.bin --out $dir/ref_bf16.bin --dtype bfloat16"
           "gpt2.py --model $dir/model.bin --batch $dir/batch_masked.bin --out $dir/ref_bf16_masked.bin --dtype bfloat16")
fi
"$py" test/reference/jobs.py --cache build/reference-cache "${jobs[@]}" || exit 1
"$bin" --check "$dir"
status=$?
if [ "$bin" = "./test_gpt2cpu" ]; then
    "$bin" --check "$dir" --precision bf16 || status=1
    # the bf16 check can fail: a CPU backend that does not round at all must miss its tolerances
    # (the CUDA build's bf16-against-fp32 ones would let it pass)
    rm -rf "$dir/unrounded" && mkdir -p "$dir/unrounded" && cp -r llmc test "$dir/unrounded/"
    sed -i 's/    if (cpu_prec.prec != PREC_FP32 \&\& p != NULL \&\& n != 0) { floatx_round_narrow/    if (0) { floatx_round_narrow/' "$dir/unrounded/llmc/cpu/round.h"
    if ! grep -q 'if (0) { floatx_round_narrow' "$dir/unrounded/llmc/cpu/round.h"; then
        echo "FAIL perturbation 'no bf16 rounding': the text to replace is not in llmc/cpu/round.h"; status=1
    elif ! ${CXX:-g++} -std=c++17 -O1 -fopenmp -x c++ -DLLMC_CPU "$dir/unrounded/test/test_gpt2.cu" -o "$dir/unrounded/test_gpt2" -lm; then
        echo "FAIL perturbation 'no bf16 rounding': build failed"; status=1
    else
        n=$("$dir/unrounded/test_gpt2" --check "$dir" --precision bf16 2>&1 | grep -c '^FAIL bf16 ')
        if [ "$n" -ge 1 ]; then echo "PASS perturbation 'no bf16 rounding' (the CPU stores fp32): the bf16 check fails ($n FAIL lines)"
        else echo "FAIL perturbation 'no bf16 rounding' went unnoticed by the bf16 check"; status=1; fi
    fi
fi
exit $status
