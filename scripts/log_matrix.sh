#!/usr/bin/env bash
# The behaviour fingerprint of the trainer, for refactors that must change nothing: runs a fixed
# matrix of jobs and keeps each one's per-step --log (step, loss, norm, lr at full precision)
# and its final checkpoint. Run it with the binaries before and after a change, then compare:
#   bash scripts/log_matrix.sh OLD_BIN_DIR /tmp/before
#   bash scripts/log_matrix.sh .           /tmp/after
#   diff -r /tmp/before /tmp/after && echo identical
# ONLY="name ..." runs only the named jobs.
# BIN_DIR holds train_gpt2cpu (MPI build) and, optionally, train_gpt2cu and train_gpt2cu_fp32
# from the emulator (build/emu/); the emulated jobs run only where those exist.
# The matrix: the default job, 50 steps; every data-parallel mode on 3 ranks, 20 steps, with 2
# micro-steps and several buckets; SFT and RLVR, 20 steps, on one rank and on 3; tp (+sp), every
# pipeline schedule, every context-parallel attention, experts and meshes of 3 axes, 6 steps
# each; the emulated CUDA trainer (bf16 and fp32) on a small model, one rank and 3 ranks.
set -u
BIN=$(cd "${1:?usage: log_matrix.sh BIN_DIR OUT_DIR}" && pwd)
OUT=${2:?usage: log_matrix.sh BIN_DIR OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 600 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
failed=0
run() {   # NAME RANKS BINARY ARGS...: the log and checkpoint land in OUT/NAME.{log,bin}
    local name=$1 np=$2 bin=$3
    shift 3
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local launch=""
    if [ "$np" -gt 1 ]; then launch="$MPIRUN -np $np"; fi
    if ! $launch "$BIN/$bin" "$@" --log "$OUT/$name.log" --save "$OUT/$name.bin" >"$OUT/$name.out" 2>&1; then
        echo "FAILED $name: $(tail -1 "$OUT/$name.out")"
        failed=1
    else
        echo "ran    $name"
    fi
}
[ -f data/arithmetic/train_000000.bin ] || make -s data
Q="--eval-every 10 --sample-every 0 --accuracy 20 --threads 1"
run default 1 train_gpt2cpu --steps 50 --threads 2
DP1="--steps 20 --batch 24 --grad-accum 2 $Q"   # (naive and ps have no buckets)
DPX="$DP1 --bucket-mb 0.5"
run dp3_naive 3 train_gpt2cpu $DP1 --dp-mode naive
run dp3_ddp 3 train_gpt2cpu $DPX
run dp3_ddp_native 3 train_gpt2cpu $DPX --comm-algo native
run dp3_ps 3 train_gpt2cpu $DP1 --dp-mode ps --ps-servers 2
run dp3_zero1 3 train_gpt2cpu $DPX --zero 1
run dp3_zero2 3 train_gpt2cpu $DPX --zero 2
run dp3_zero3 3 train_gpt2cpu $DPX --zero 3
run dp3_zero1_offload 3 train_gpt2cpu $DPX --zero 1 --offload
run dp3_zero2_offload 3 train_gpt2cpu $DPX --zero 2 --offload
run sft 1 train_gpt2cpu --task sft --steps 20 --batch 24 --grad-accum 2 --shuffle $Q
run sft_dp3_zero2 3 train_gpt2cpu --task sft --steps 20 --batch 24 --grad-accum 2 --zero 2 $Q
RL="--task rlvr --steps 20 --batch 24 --group 4 --max-new 5 --kl 0.05 $Q"   # (a prompt of 7 + 5 - 1 fits the default --seq 11)
run rlvr 1 train_gpt2cpu $RL --metrics "$OUT/rlvr.csv"
run rlvr_dp3_zero3 3 train_gpt2cpu $RL --zero 3 --grad-accum 2 --metrics "$OUT/rlvr_dp3.csv"
# the other strategies, each a few steps on the tiny model: tp (with sp, and off-grid), every
# pipeline schedule, every context-parallel attention and split, experts, and meshes of 3 and 4 axes
MX="--steps 6 --batch 16 --grad-accum 4 --seq 12 $Q"   # (12: split by --sp on 2 and 3 ranks and by --cp 2 zigzag into 4)
run tp2_sp 2 train_gpt2cpu $MX --tp 2 --sp
run tp3 3 train_gpt2cpu $MX --tp 3 --heads 3 --channels 96
for s in gpipe 1f1b zb-h1; do run pp2_$s 2 train_gpt2cpu $MX --pp 2 --pp-schedule $s; done
run pp2_interleaved 2 train_gpt2cpu $MX --pp 2 --pp-schedule interleaved --pp-chunks 3
run pp3_split 3 train_gpt2cpu $MX --pp 3 --pp-split 1,2,3
for a in ring allgather alltoall; do run cp2_$a 2 train_gpt2cpu $MX --cp 2 --cp-algo $a; done
run cp2_ring_plain 2 train_gpt2cpu $MX --cp 2 --cp-split plain
run ep2_moe 2 train_gpt2cpu $MX --moe-experts 4 --moe-every 1 --moe-topk 2 --ep 2
run mesh_dp2_pp2_tp2 8 train_gpt2cpu $MX --tp 2 --pp 2 --zero 1
run mesh_cp2_tp2_zero3 4 train_gpt2cpu $MX --cp 2 --tp 2 --zero 3
run mesh_tp2_ep2_moe 4 train_gpt2cpu $MX --tp 2 --moe-experts 4 --moe-every 1 --ep 2
if [ -x "$BIN/train_gpt2cu" ]; then
    SMALL="--layers 2 --heads 2 --channels 32 --max-seq 32 --seq 16 --eval-every 3 --sample-every 0 --accuracy 4 --threads 1"
    for p in train_gpt2cu train_gpt2cu_fp32; do
        run emu_${p}_single 1 $p $SMALL --batch 6 --steps 6 --grad-accum 2
        run emu_${p}_dp3_ddp 3 $p $SMALL --batch 6 --steps 4 --bucket-mb 0.01
        run emu_${p}_dp3_zero3 3 $p $SMALL --batch 6 --steps 4 --zero 3
    done
    run emu_sft 1 train_gpt2cu $SMALL --task sft --batch 6 --steps 4
    run emu_rlvr 1 train_gpt2cu $SMALL --task rlvr --batch 4 --group 2 --max-new 4 --steps 3 --seq 24
fi
# the printed output carries timings; keep only the lines that carry no time
for f in "$OUT"/*.out; do
    grep -v -E "ms|tok/s|GFLOP|trace:|threads|exposed|rollout" "$f" | sed "s|$OUT|OUT|g" >"${f%.out}.text"
    rm -f "$f"
done
exit $failed
