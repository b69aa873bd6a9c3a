#!/usr/bin/env bash
# Mixture of experts and expert parallelism of the CUDA trainer under the CPU emulator (dev/emu/):
# build/emu/train_gpt2cu with --moe-experts (the MoE kernels of llmc/cuda/moe.cuh: router softmax,
# row gathers, the gated combine and its backward, the router's backward; the experts' matmuls
# on per-expert row counts) and under mpirun with --ep (token rows as device buffers through the
# all-to-all-v over the host-staged wire, the edp all-reduce) against the single-rank emulated
# MoE run. The CPU twin, in fp32, is test/test_moe.sh.
#   - bf16 (the default build): losses against 2^-9 relative, gradient norms against 2^-8,
#     parameters printed, not judged (test/judge_bf16.py);
#   - fp32 (train_gpt2cu_fp32): the same code must match one rank within 1e-5, parameters
#     included (test/compare_runs.py);
#   - every ep run: every step's all-to-all bytes equal the formula from the routing.
set -u
cd "$(dirname "$0")/.."
T=build/emu-moe-test
WHAT="emulated expert parallelism"
# shellcheck source=test/lib_emu_mpi.sh
source test/lib_emu_mpi.sh   # EMU, pass, fail (status), MPIRUN, D; stops here without MPI
STEPS=4
MODEL="--layers 2 --heads 4 --channels 64 --max-seq 32 --batch 4 --seq 32 --steps $STEPS --lr 1e-3 --warmup 2 --moe-experts 4 --moe-topk 2 --moe-every 1 --moe-capacity 1.0"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1 --comm-algo ring"

emu_refs   # the single-rank references (test/lib_emu_mpi.sh)

# BINARY|NP|NAME|FLAGS (emu_run: test/lib_emu_mpi.sh)
RUNS=("train_gpt2cu|2|ep 2, E 4, top-2|--ep 2"
      "train_gpt2cu_fp32|2|fp32: ep 2, E 4, top-2|--ep 2"
      "train_gpt2cu_fp32|4|fp32: dp 4 with ep 2, ZeRO-1|--ep 2 --zero 1"
      "train_gpt2cu_fp32|4|fp32: ep 2 x tp 2|--ep 2 --tp 2")
i=0
for entry in "${RUNS[@]}"; do
    i=$((i + 1))
    emu_run "$i" "$entry" || continue
    n=$(grep -c "ep comm | all-to-all sent .*, equal;" "$T/run$i.out")
    [ "$n" -eq "$STEPS" ] || fail "$tag: all-to-all bytes = formula in $n of $STEPS steps" "$(grep -m2 'ep comm |' "$T/run$i.out")"
done
[ $status -eq 0 ] && pass "every emulated expert-parallel run: all-to-all bytes = formula on every step"
exit $status
