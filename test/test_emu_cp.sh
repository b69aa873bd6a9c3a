#!/usr/bin/env bash
# Context parallelism of the CUDA trainer under the CPU emulator (dev/emu/): build/emu/train_gpt2cu
# under mpirun with --cp (the block-attention kernels of llmc/cuda/attention_block.cuh: partial
# outputs with their log-sum-exp, the merge, the block backward; the K,V blocks and their fp32
# gradients passed around the ring as device buffers over the host-staged wire; the all-gather,
# reduce-scatter and all-to-all on device buffers; the embedding's global positions) against the
# single-rank emulated run. The CPU twin, in fp32, is test/test_cp.sh.
#   - bf16 (the default build): the ranks add the attention's partial results in another order
#     than one rank's flash kernel, and bf16 rounds each; losses are judged against 2^-9 relative
#     and gradient norms against 2^-8, parameters printed, not judged (test/judge_bf16.py);
#   - fp32 (train_gpt2cu_fp32): the same code must match one rank within 1e-5, parameters
#     included (test/compare_runs.py);
#   - every run: every step's cp bytes equal the formula.
set -u
cd "$(dirname "$0")/.."
T=build/emu-cp-test
WHAT="emulated context parallelism"
# shellcheck source=test/lib_emu_mpi.sh
source test/lib_emu_mpi.sh   # EMU, pass, fail (status), MPIRUN, D; stops here without MPI
STEPS=4
MODEL="--layers 2 --heads 4 --channels 64 --max-seq 32 --batch 4 --seq 32 --steps $STEPS --lr 1e-3 --warmup 2"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1 --comm-algo ring"

emu_refs   # the single-rank references (test/lib_emu_mpi.sh)

# BINARY|NP|NAME|FLAGS (emu_run: test/lib_emu_mpi.sh)
RUNS=("train_gpt2cu|2|cp 2, ring, zigzag|--cp 2"
      "train_gpt2cu|2|cp 2, alltoall|--cp 2 --cp-algo alltoall"
      "train_gpt2cu_fp32|2|fp32: cp 2, ring, zigzag|--cp 2"
      "train_gpt2cu_fp32|4|fp32: cp 4, ring, plain|--cp 4 --cp-split plain"
      "train_gpt2cu_fp32|2|fp32: cp 2, allgather|--cp 2 --cp-algo allgather"
      "train_gpt2cu_fp32|2|fp32: cp 2, alltoall|--cp 2 --cp-algo alltoall"
      "train_gpt2cu|4|cp 2 x tp 2 + SP, ring|--cp 2 --tp 2 --sp"
      "train_gpt2cu_fp32|4|fp32: dp 2 x cp 2, ZeRO-2, ring|--cp 2 --dp 2 --zero 2")
i=0
for entry in "${RUNS[@]}"; do
    i=$((i + 1))
    emu_run "$i" "$entry" || continue
    n=$(grep -c "cp comm | sent .* equal)" "$T/run$i.out")
    [ "$n" -eq "$STEPS" ] || fail "$tag: cp bytes = formula in $n of $STEPS steps" "$(grep -m2 'cp comm |' "$T/run$i.out")"
done
[ $status -eq 0 ] && pass "every emulated context-parallel run: bytes = formula on every step"
exit $status
