#!/usr/bin/env bash
# The GPU bundle's run.sh (scripts/gpu_bundle_run.sh) end to end without a GPU: a bundle made with
# BUNDLE_EMU=1 (the reference files, the data, the CPU's training log, run.sh; no nvcc) and run.sh
# --quick against the emulated CUDA binaries (build/emu: RUN_BIN_DIR, RUN_LAB_DIR), so the script,
# its order, its summary and its paste-ready section are exercised before a GPU sees them. This is
# also the CUDA build's reference check in make test: test_gpt2cu bf16 and fp32 (emulated) against
# PyTorch, with the determinism check (identical reruns, bit-exact save and reload).
#   1. run.sh --quick passes: every row PASS, in the bundle's fixed order (kernels, reference
#      bf16 and fp32, training against the CPU, the throughput run, its --profile table, one row
#      per production kernel, then the extension points, the training state, recomputation, loss
#      scaling and FP8), and gpu-results.md is a markdown section with the same rows.
#   2. it can fail: a CPU log whose losses are 1% off makes the training row FAIL and the exit 1
#      (run.sh --only train: one check).
#   3. one clear line, exit 1: no nvidia-smi; a GPU but a library the binary needs is not found (a
#      stand-in binary linked against a library that is then removed); a reference file missing.
set -u
cd "$(dirname "$0")/.."
T=build/gpu-bundle-test
E=build/emu
rm -rf "$T"
mkdir -p "$T"
status=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for l in "$@"; do echo "     $l"; done; status=1; }

for b in $E/test_gpt2cu $E/test_gpt2cu_fp32 $E/train_gpt2cu $E/test_cuda_kernels $E/dev/cuda/adamw ./train_gpt2cpu; do
    [ -x "$b" ] || { fail "missing $b" "build it: make emu train_gpt2cpu"; exit 1; }
done
if ! BUNDLE_EMU=1 BUNDLE_DIR=$T/bundle bash scripts/gpu_bundle.sh >"$T/make.log" 2>&1; then
    fail "BUNDLE_EMU=1 scripts/gpu_bundle.sh" "$(tail -n 3 "$T/make.log")"; exit 1
fi
B=$T/bundle

# ---- 1. run.sh --quick against the emulated binaries
RUN_BIN_DIR=$E RUN_LAB_DIR=$E/dev/cuda bash "$B/run.sh" --quick --out "$T/quick" >"$T/quick.out" 2>&1
rc=$?
S=$T/quick/summary.txt
want=("device" "test_cuda_kernels" "test_gpt2cu bf16 vs PyTorch" "test_gpt2cu fp32 vs PyTorch" "train 10 steps (default job) vs train_gpt2cpu"
      "GPT-2 124M bf16," "GPT-2 124M bf16 --profile" "kernel encoder_forward" "kernel encoder_backward" "kernel layernorm_forward" "kernel layernorm_backward"
      "kernel matmul_forward" "kernel matmul_backward" "kernel attention_forward" "kernel attention_backward" "kernel gelu_forward"
      "kernel gelu_backward" "kernel classifier" "kernel adamw" "kernel global_norm" "test_seams" "training state: stopped after 3"
      "--recompute selective, full = none" "dynamic loss scaling" "--fp8 current vs bf16")
order=$(tail -n +2 "$S" 2>/dev/null | cut -d'|' -f1 | sed 's/ *$//')
ok=1
i=0
while IFS= read -r line; do
    case "$line" in "${want[$i]}"*) ;; *) ok=0 ;; esac
    i=$((i + 1))
done <<<"$order"
[ "$i" = "${#want[@]}" ] || ok=0
nfail=$(grep -c '| FAIL ' "$S" 2>/dev/null)
if [ "$rc" = 0 ] && [ $ok = 1 ] && [ "$nfail" = 0 ]; then
    pass "run.sh --quick (emulated): ${#want[@]} rows in order, none FAIL, exit 0"
else
    fail "run.sh --quick (emulated): exit $rc, $nfail FAIL rows, rows in order: $ok" "$(cat "$S" 2>/dev/null)" "$(tail -n 5 "$T/quick.out")"
fi
sed 's/^/    /' "$S"
# the CUDA builds' reference check line by line (what the emu-reference suite printed before)
for p in bf16 fp32; do
    grep -E '^(PASS|FAIL) ' "$T/quick/reference_$p.log" | sed -E "s/^(PASS|FAIL) /\1 [test_gpt2cu $p, emulated] /"
done
for r in "test_gpt2cu bf16" "test_gpt2cu fp32" "test_cuda_kernels" "train 10 steps"; do
    fig=$(grep "^$r" "$S" | cut -d'|' -f3)
    n=$(echo "$fig" | grep -o '^ *[0-9]* PASS' | grep -o '[0-9]*')
    case "$r" in
        train*) echo "$fig" | grep -q "loss rel err" && pass "the training row gives its figures:$fig" || fail "training row: '$fig'" ;;
        *) [ "${n:-0}" -ge 5 ] && pass "$r row: $n PASS lines in its log" || fail "$r row: '$fig'" ;;
    esac
done
md=$T/quick/gpu-results.md
if grep -q "^## " "$md" && grep -q "^| check | result | figure |" "$md" && [ "$(grep -c '^| .* | PASS \|^| .* | info ' "$md")" = "${#want[@]}" ] &&
   grep -q "^- bundle: commit" "$md"; then
    pass "gpu-results.md: a heading, the device and bundle lines, a table with the ${#want[@]} rows"
else
    fail "gpu-results.md is not the expected section" "$(head -n 12 "$md" 2>/dev/null)"
fi

# ---- 2. it can fail: the CPU's reference log 1% off
cp -r "$B" "$T/off"
awk '{ $2 = $2 * 1.01; print }' "$B/cpu/train50.log" >"$T/off/cpu/train50.log"
RUN_BIN_DIR=$E RUN_LAB_DIR=$E/dev/cuda bash "$T/off/run.sh" --only train --out "$T/off_res" >"$T/off.out" 2>&1
rc=$?
if [ "$rc" = 1 ] && grep -q "^train 10 steps.*| FAIL " "$T/off_res/summary.txt"; then
    pass "perturbation: the CPU's losses 1% off make the training row FAIL and run.sh exit 1"
else
    fail "perturbation: the CPU's losses 1% off went unnoticed (exit $rc)" "$(grep '^train' "$T/off_res/summary.txt")"
fi

# ---- 3. one clear line on a missing GPU, library or file
onel() {   # onel LABEL PATTERN CMD...: CMD exits 1 with one line of output matching PATTERN
    local label=$1 pat=$2 out rc; shift 2
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" = 1 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "$pat"; then pass "$label: '$out'"
    else fail "$label: exit $rc" "$out"; fi
}
mkdir -p "$T/nogpu"
onel "no GPU" "no GPU: nvidia-smi is not found" env PATH="$T/nogpu:/usr/bin:/bin" bash "$B/run.sh" --out "$T/r1"
# a GPU (a stand-in nvidia-smi) and a binary that needs a library nobody has
mkdir -p "$T/fake/lib" "$T/fake/path"
printf '#!/bin/sh\necho "GPU 0: Stand-in GPU (UUID: GPU-0)"\n' >"$T/fake/path/nvidia-smi"
chmod +x "$T/fake/path/nvidia-smi"
echo 'int llmc_fake_blas(void) { return 1; }' >"$T/fake/lib.c"
echo 'int llmc_fake_blas(void); int main(void) { return llmc_fake_blas(); }' >"$T/fake/main.c"
cp -r "$B" "$T/nolib"
if cc -shared -fPIC "$T/fake/lib.c" -o "$T/fake/lib/libcublasLt_standin_$$.so" &&
   cc "$T/fake/main.c" -L"$T/fake/lib" -lcublasLt_standin_$$ -o "$T/nolib/bin/train_gpt2cu" 2>/dev/null; then
    rm "$T/fake/lib/libcublasLt_standin_$$.so"
    cp "$T/nolib/bin/train_gpt2cu" "$T/nolib/bin/test_gpt2cu"
    onel "a library not found" "train_gpt2cu needs libcublasLt_standin_$$.so and it is not found" \
        env PATH="$T/fake/path:$PATH" RUN_LIB_SEARCH=0 bash "$T/nolib/run.sh" --out "$T/r2"
else
    fail "could not build the stand-in binary (cc)"
fi
# the libraries found (the stand-in library kept), a reference file missing
cp -r "$B" "$T/noref"
cc -shared -fPIC "$T/fake/lib.c" -o "$T/fake/lib/libcublasLt_standin_$$.so" && cp "$T/nolib/bin/train_gpt2cu" "$T/nolib/bin/test_gpt2cu" "$T/noref/bin/"
rm "$T/noref/ref/moe_c_ref.bin"
onel "a reference file missing" "the bundle is incomplete: ref/moe_c_ref.bin is missing" \
    env PATH="$T/fake/path:$PATH" LD_LIBRARY_PATH="$T/fake/lib" RUN_LIB_SEARCH=0 bash "$T/noref/run.sh" --out "$T/r3"

exit $status
