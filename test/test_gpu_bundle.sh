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
#      (run.sh --only train: one check). And the training and loss-scaling rows as judged since
#      the H200 run, through a stand-in train_gpt2cu: a gradient norm 2% off, a loss that does not
#      go down while every step agrees, a step missing; no forced overflow, a scale not halved:
#      each row FAIL and exit 1 (a pass-through stand-in PASS first).
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

# ---- 2b. the training row and the loss-scaling row as judged since the H200 run (steps 1-10 against
# the CPU's tolerances and the loss down; the forced overflow at 2^64 skips steps and halves the
# scale each time): each fails when what it checks is broken. A stand-in train_gpt2cu (RUN_BIN_DIR)
# stands for the GPU's trainer: for the training row it writes a given --log (no training: the row
# judges the two logs); for loss scaling it runs the emulated trainer, changed as each case says.
# A pass-through stand-in must PASS first, so a FAIL below is the perturbation's, not the stand-in's.
# standin_log DIR FILE: DIR/train_gpt2cu copies FILE to its --log path
# standin_run DIR SED: DIR/train_gpt2cu runs the emulated trainer, SED applied to its arguments
# standin_replay DIR FILE SED: DIR/train_gpt2cu prints FILE (an earlier run's output) through SED
standin_log() {
    mkdir -p "$1"
    cat >"$1/train_gpt2cu" <<EOS
#!/usr/bin/env bash
log=""; prev=""; for a in "\$@"; do [ "\$prev" = --log ] && log=\$a; prev=\$a; done
cp "$2" "\$log"
echo "average step (excluding the first): 1.0 ms | 1 tok/s"
EOS
    chmod +x "$1/train_gpt2cu"
}
standin_run() {
    mkdir -p "$1"
    cat >"$1/train_gpt2cu" <<EOS
#!/usr/bin/env bash
mapfile -t args < <(printf '%s\n' "\$@" | sed '$2')
exec "$PWD/$E/train_gpt2cu" "\${args[@]}"
EOS
    chmod +x "$1/train_gpt2cu"
}
standin_replay() {
    mkdir -p "$1"
    printf '#!/usr/bin/env bash\nsed %q %q\n' "$3" "$2" >"$1/train_gpt2cu"
    chmod +x "$1/train_gpt2cu"
}
# judge NAME CHECK BUNDLE WANT LABEL: run.sh --only CHECK from BUNDLE with $T/NAME as RUN_BIN_DIR;
# WANT PASS: the row PASS and exit 0; WANT FAIL: the row FAIL and exit 1
judge() {
    local name=$1 check=$2 bundle=$3 want=$4 label=$5 rc rowl want_rc=0
    RUN_BIN_DIR=$T/$name RUN_LAB_DIR=$E/dev/cuda bash "$bundle/run.sh" --only "$check" --out "$T/${name}_res" >"$T/$name.out" 2>&1
    rc=$?
    rowl=$(grep -E "^(train|dynamic loss)" "$T/${name}_res/summary.txt" 2>/dev/null)
    [ "$want" = FAIL ] && want_rc=1
    if [ "$rc" = "$want_rc" ] && echo "$rowl" | grep -q "| $want "; then
        pass "$label: row $want, exit $rc:$(echo "$rowl" | cut -d'|' -f3 | cut -c1-160)"
    else
        fail "$label: exit $rc, wanted the row $want and exit $want_rc" "$rowl" "$(tail -n 3 "$T/$name.out")"
    fi
}
CPU=$B/cpu/train50.log
standin_log "$T/st_ok" "$CPU"
judge st_ok train "$B" PASS "training row, a stand-in whose log is the CPU's own"
awk '$1 == 7 { $3 = $3 * 1.02 } { print }' "$CPU" >"$T/norm2.log"
standin_log "$T/st_norm" "$T/norm2.log"
judge st_norm train "$B" FAIL "training row, the gradient norm 2% off at step 7 (losses equal)"
# the loss does not go down while every step agrees: the same log on both sides (a bundle copy
# whose CPU log it is), each step's loss the first step's
cp -r "$B" "$T/flat"
awk 'NR == 1 { l = $2 } { $2 = l; print }' "$CPU" >"$T/flat/cpu/train50.log"
standin_log "$T/st_flat" "$T/flat/cpu/train50.log"
judge st_flat train "$T/flat" FAIL "training row, every step agrees but the loss does not go down ($(wc -l <"$CPU") steps)"
awk '$1 != 5' "$CPU" >"$T/gap.log"
standin_log "$T/st_gap" "$T/gap.log"
judge st_gap train "$B" FAIL "training row, step 5 missing from the GPU's log"
# loss scaling: the emulated trainer through the stand-in as it is; then without the forced
# overflow (--loss-scale-init 65536: nothing overflows, no step skipped); then that first run's
# output with the scale on the step lines doctored to stay 2^64 (steps skipped, the scale not halved)
standin_run "$T/ls_ok" 's/^$//'
judge ls_ok losscale "$B" PASS "loss-scaling row, a stand-in running the trainer as it is"
standin_run "$T/ls_noov" 's/^18446744073709551616$/65536/'
judge ls_noov losscale "$B" FAIL "loss-scaling row, no forced overflow (first scale 65536)"
standin_replay "$T/ls_nohalf" "$T/ls_ok_res/losscale.log" 's/| scale [0-9.e+]* /| scale 1.84467e+19 /'
judge ls_nohalf losscale "$B" FAIL "loss-scaling row, steps skipped but the printed scale not halved"

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
