#!/usr/bin/env bash
# Pipeline parallelism of the CUDA trainer under the CPU emulator (dev/emu/): build/emu/train_gpt2cu
# under mpirun with --pp (the CUDA kernels, the split backward's NULL halves, the activations and
# gradients sent between stages as device buffers over the host-staged wire, the embedding
# group's all-reduce on a device buffer) against the single-rank emulated run with the same
# micro-batches. The CPU twin, in fp32, is test/test_pp.sh.
#   - bf16 (the default build): the stages sum the tied wte's two gradient parts in another order
#     than one rank, and bf16 rounds each; losses are judged against 2^-9 relative and gradient
#     norms against 2^-8, parameters printed, not judged (test_emu_tp.sh's reasons, and
#     test/judge_bf16.py);
#   - fp32 (train_gpt2cu_fp32): the same code must match one rank within 1e-5, parameters
#     included (test/compare_runs.py). pp x tp runs in bf16 only: at this shape (4 layers, 4
#     micro-batches) even tp 2 alone, without a pipeline, ends 1.2e-5 from one rank in fcprojw
#     in fp32 (measured: 6.4e-4 of the tensor's largest element; losses and norms agree to 1e-7,
#     and the CPU build's fp32 kernels pass 1e-5 in test_pp.sh), so that pairing is judged in bf16;
#   - every run: the pipeline's memory check and every step's bytes / in-flight check.
set -u
cd "$(dirname "$0")/.."
T=build/emu-pp-test
WHAT="emulated pipeline parallelism"
# shellcheck source=test/lib_emu_mpi.sh
source test/lib_emu_mpi.sh   # EMU, pass, fail (status), MPIRUN, D; stops here without MPI
STEPS=4
MODEL="--layers 4 --heads 4 --channels 64 --max-seq 32 --batch 8 --seq 16 --steps $STEPS --lr 1e-3 --warmup 2"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1 --grad-accum 4"   # 4 micro-batches in every run


emu_refs   # the single-rank references (test/lib_emu_mpi.sh)

# BINARY|NP|NAME|FLAGS (emu_run: test/lib_emu_mpi.sh) (4 micro-batches each)
RUNS=("train_gpt2cu|2|pp 2, 1f1b|--pp 2"
      "train_gpt2cu|2|pp 2, zb-h1|--pp 2 --pp-schedule zb-h1"
      "train_gpt2cu|4|dp 2 x pp 2, ZeRO-1|--pp 2 --zero 1"
      "train_gpt2cu_fp32|2|fp32: pp 2, gpipe|--pp 2 --pp-schedule gpipe"
      "train_gpt2cu_fp32|2|fp32: pp 2, interleaved v 2|--pp 2 --pp-schedule interleaved"
      "train_gpt2cu_fp32|4|fp32: pp 4, zb-h1|--pp 4 --pp-schedule zb-h1"
      "train_gpt2cu|4|pp 2 x tp 2 + SP, 1f1b|--pp 2 --tp 2 --sp"
      "train_gpt2cu_fp32|4|fp32: dp 2 x pp 2, ZeRO-2, zb-h1|--pp 2 --zero 2 --pp-schedule zb-h1")
i=0
for entry in "${RUNS[@]}"; do
    i=$((i + 1))
    emu_run "$i" "$entry" || continue
    grep -q "^pp memory check ok" "$T/run$i.out" && grep -q "^memory check ok" "$T/run$i.out" ||
        fail "$tag: memory lines" "$(grep -E 'memory check' "$T/run$i.out")"
    n=$(grep -c "pp comm | sent .* check ok" "$T/run$i.out")
    [ "$n" -eq "$STEPS" ] || fail "$tag: pipeline bytes / in flight = formula / schedule in $n of $STEPS steps" "$(grep -m2 'pp comm |' "$T/run$i.out")"
done
[ $status -eq 0 ] && pass "every emulated pipeline run: memory = formula, bytes = formula and in flight = schedule on every step"
exit $status
