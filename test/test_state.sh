#!/usr/bin/env bash
# The training state (llmc/train/train_state.h, doc/training-state.md) on CPU ranks:
#   - bit-exact resume: a run stopped after step 5 of 10 (--save-state DIR --exit-after 5) and
#     resumed (--resume DIR) writes a --log byte-identical to the run that never stopped, for
#     one rank; DDP, naive, the parameter server (1 and 2 servers), ZeRO-1, ZeRO-2 (2 micro-steps),
#     ZeRO-3, ZeRO-2 + offload; tp 2, tp 2 + sp, dp 2 x tp 2 with ZeRO-1; the four pipeline
#     schedules; cp 2 (ring) and cp 2 (Ulysses); ep 2 (MoE) and dp 4 x ep 2 with ZeRO-1; SFT (shuffled) and
#     RLVR (running-mean baseline with a KL penalty; GRPO with tp 2; its --metrics CSV with
#     held-out accuracy, stopped at an evaluation step);
#   - resharding: a state saved on one mesh continues on another within 1e-5 of the run that did
#     not move (test/compare_runs.py: every step's loss and norm, every final tensor): dp 4 ZeRO-3
#     -> dp 2 x tp 2; pp 2 -> one rank; ep 4 -> ep 2; tp 2 -> dp 2 ZeRO-2; tp 3 (the vocabulary
#     padded further, 384 rows) -> tp 2;
#   - the export: scripts/state_to_model.py writes the same bytes as the trainer's --save;
#   - the directory: a save that a later save replaced is removed, a crashed save's .tmp
#     directory is ignored, a full disk (ulimit -f) fails the save on every rank and keeps the
#     previous state, from which the run then resumes bit-exactly;
#   - bad data found mid-run: the state saved before the step that would read it; fixed, resumed exactly;
#   - bad state directories: no 'latest', an incomplete step directory, a corrupt and a
#     truncated rank file, another model's or another run's state: one line, every rank exits
#     non-zero, no hang;
#   - the tests can fail: the trainer with deliberate bugs (test/perturbations.py: the data position, AdamW's
#     t or its moment m not restored) must fail the bit-exact resume (STATE_PERTURB=0 skips).
set -u
cd "$(dirname "$0")/.."
T=build/state-test
rm -rf "$T"
mkdir -p "$T"
WHAT="the training-state tests"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all, perturb, ref; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 4000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
D="$D --sft-train $T/data/sft_train_*.bin --sft-val $T/data/sft_val_*.bin --prompts $T/data/sft_train_*.bin"
MODEL="--layers 4 --heads 4 --channels 64 --batch 8 --seq 32 --steps 10 --lr 1e-3 --warmup 5"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"

# resume NP LABEL [BINARY] -- FLAGS...: the run that never stops, the run stopped after step 5, its
# continuation; the two --log files must be the same bytes. Returns 1 when they differ.
resume() {
    local np=$1 label=$2 bin=./train_gpt2cpu W
    shift 2
    if [ "$1" != "--" ]; then bin=$1; shift; fi
    shift
    W="$T/$label"
    rm -rf "$W"
    mkdir -p "$W"
    # shellcheck disable=SC2086
    if ! $MPIRUN -np "$np" $bin $D $MODEL $QUIET "$@" --log "$W/a.log" >"$W/a.out" 2>&1 ||
       ! $MPIRUN -np "$np" $bin $D $MODEL $QUIET "$@" --save-state "$W/S" --exit-after 5 >"$W/b1.out" 2>&1 ||
       ! $MPIRUN -np "$np" $bin $D $MODEL $QUIET "$@" --log "$W/b.log" --resume "$W/S" --save-state "$W/S" >"$W/b.out" 2>&1; then
        fail "resume $label: a run failed" "$(cat "$W"/*.out | grep -m2 error)"
        return 1
    fi
    if cmp -s "$W/a.log" "$W/b.log" && [ "$(wc -l <"$W/b.log")" -eq 10 ]; then
        [ "$bin" = ./train_gpt2cpu ] && pass "resume $label: stopped after step 5 of 10, the resumed --log is byte-identical"
        return 0
    fi
    [ "$bin" = ./train_gpt2cpu ] && fail "resume $label: the logs differ" "$(diff "$W/a.log" "$W/b.log" | head -3)"
    return 1
}

resume 1 one-rank --
resume 2 ddp --
resume 2 naive -- --dp-mode naive
resume 2 ps-1-server -- --dp-mode ps --ps-servers 1
resume 4 ps-2-servers -- --dp-mode ps --ps-servers 2
resume 2 zero1 -- --zero 1
resume 2 zero2-accum -- --zero 2 --grad-accum 2
resume 4 zero3 -- --zero 3
resume 2 zero2-offload -- --zero 2 --offload
resume 2 tp2 -- --tp 2
resume 2 tp2-sp -- --tp 2 --sp
resume 4 dp2-tp2-zero1 -- --tp 2 --zero 1
resume 2 pp-gpipe -- --pp 2 --grad-accum 2 --pp-schedule gpipe
resume 2 pp-1f1b -- --pp 2 --grad-accum 2
resume 2 pp-interleaved -- --pp 2 --grad-accum 2 --pp-schedule interleaved
resume 2 pp-zb-h1 -- --pp 2 --grad-accum 2 --pp-schedule zb-h1
resume 2 cp-ring -- --cp 2
resume 2 cp-ulysses -- --cp 2 --cp-algo alltoall
resume 2 ep2-moe -- --moe-experts 4 --moe-every 1 --ep 2
resume 4 dp4-ep2-zero1 -- --moe-experts 4 --moe-every 2 --ep 2 --zero 1
resume 2 sft -- --task sft --shuffle
resume 2 rlvr-baseline-kl -- --task rlvr --group 4 --rl-mode baseline --kl 0.1
resume 2 rlvr-grpo-tp2 -- --task rlvr --group 4 --tp 2

# RLVR's --metrics CSV (per-step rewards and the held-out accuracy of evaluations every 3 steps,
# one of them at the stop): the resumed run's file is the uninterrupted run's, byte for byte
W="$T/metrics"
rm -rf "$W"
mkdir -p "$W"
RL="$D $MODEL $QUIET --task rlvr --group 4 --eval-every 3 --accuracy 16"
$MPIRUN -np 2 ./train_gpt2cpu $RL --metrics "$W/a.csv" >"$W/a.out" 2>&1
$MPIRUN -np 2 ./train_gpt2cpu $RL --metrics "$W/b1.csv" --save-state "$W/S" --exit-after 6 >"$W/b1.out" 2>&1
$MPIRUN -np 2 ./train_gpt2cpu $RL --metrics "$W/b.csv" --resume "$W/S" >"$W/b.out" 2>&1
if [ -s "$W/a.csv" ] && cmp -s "$W/a.csv" "$W/b.csv"; then
    pass "resume rlvr --metrics: stopped after step 6 (an evaluation step) of 10, the resumed CSV is byte-identical"
else
    fail "resume rlvr --metrics" "$(diff "$W/a.csv" "$W/b.csv" | head -3)" "$(grep -h -m2 error "$W"/*.out)"
fi

# The resumed run of the last case saved into the same directory at the end: only step 10 is left.
if [ "$(ls "$T/rlvr-grpo-tp2/S")" = "$(printf 'latest\nstep-00000010')" ] && grep -q step-00000010 "$T/rlvr-grpo-tp2/S/latest"; then
    pass "a newer state replaces the older one: $(ls "$T/rlvr-grpo-tp2/S" | tr '\n' ' ')"
else
    fail "the state directory after a second save" "$(ls "$T/rlvr-grpo-tp2/S" | tr '\n' ' ')"
fi

# ---- resharding: saved on mesh A at step 5, continued on mesh B, against mesh A's whole run
reshard() {
    local label=$1 npa=$2 fa=$3 npb=$4 fb=$5 W="$T/reshard-$1"
    rm -rf "$W"
    mkdir -p "$W"
    # shellcheck disable=SC2086
    if ! $MPIRUN -np "$npa" ./train_gpt2cpu $D $MODEL $QUIET $fa --log "$W/a.log" --save "$W/a.bin" >"$W/a.out" 2>&1 ||
       ! $MPIRUN -np "$npa" ./train_gpt2cpu $D $MODEL $QUIET $fa --save-state "$W/S" --exit-after 5 >"$W/b1.out" 2>&1 ||
       ! $MPIRUN -np "$npb" ./train_gpt2cpu $D $MODEL $QUIET $fb --resume "$W/S" --log "$W/b.log" --save "$W/b.bin" >"$W/b.out" 2>&1; then
        fail "reshard $label: a run failed" "$(cat "$W"/*.out | grep -m2 error)"
        return
    fi
    if ! grep -q "resharded to this mesh" "$W/b.out"; then fail "reshard $label: not reported as resharded"; return; fi
    python3 test/compare_runs.py "$W/a.log" "$W/a.bin" "$W/b.log" "$W/b.bin" --label "reshard $label: steps 6-10 match the run that did not move"
}
reshard "dp4-zero3-to-dp2xtp2" 4 "--zero 3" 4 "--dp 2 --tp 2"
reshard "pp2-to-one-rank" 2 "--pp 2 --grad-accum 2" 1 "--grad-accum 2"
reshard "ep4-to-ep2" 4 "--moe-experts 4 --moe-every 1 --ep 4" 2 "--moe-experts 4 --moe-every 1 --ep 2"
reshard "tp2-to-dp2-zero2" 2 "--tp 2" 2 "--zero 2"
# tp 3 does not divide the padded vocabulary 320: its shards hold 384 rows (llmc/model/params_shard.h:
# tp_vocab_rows), its state 320; tp 2 holds 320 again (6 heads of 8 channels: both divide them)
reshard "tp3-to-tp2" 3 "--heads 6 --channels 48 --tp 3" 2 "--heads 6 --channels 48 --tp 2"

# ---- the export: the state's model as llm.c's file, the same bytes as --save
for mesh in "4|--zero 3" "4|--tp 2 --zero 1" "4|--moe-experts 4 --moe-every 2 --ep 2"; do
    np=${mesh%%|*}; flags=${mesh#*|}
    rm -rf "$T/export"
    # shellcheck disable=SC2086
    if $MPIRUN -np "$np" ./train_gpt2cpu $D $MODEL $QUIET $flags --steps 4 --save "$T/export.bin" --save-state "$T/export" >"$T/export.out" 2>&1 &&
       python3 scripts/state_to_model.py "$T/export" "$T/exported.bin" >"$T/export.py.out" 2>&1 && cmp -s "$T/export.bin" "$T/exported.bin"; then
        pass "state_to_model.py ($flags): the same bytes as --save"
    else
        fail "state_to_model.py ($flags)" "$(tail -2 "$T/export.out" "$T/export.py.out")"
    fi
done

# ---- the directory under failures
rm -rf "$T/crashed"   # a one-rank state at step 5, then a save at step 7 that crashed half-way
$MPIRUN -np 1 ./train_gpt2cpu $D $MODEL $QUIET --save-state "$T/crashed" --exit-after 5 >"$T/crashed.out" 2>&1
mkdir -p "$T/crashed/step-00000007.tmp"
head -c 1000 "$T/crashed/step-00000005/rank-00000.bin" >"$T/crashed/step-00000007.tmp/rank-00000.bin"   # a save cut short
rm -rf "$T/crashed2"
cp -r "$T/crashed" "$T/crashed2"
if $MPIRUN -np 1 ./train_gpt2cpu $D $MODEL $QUIET --resume "$T/crashed2" --save-state "$T/crashed2" --log "$T/crashed.log" >"$T/crashed2.out" 2>&1 &&
   cmp -s "$T/crashed.log" "$T/one-rank/a.log" && [ "$(ls "$T/crashed2" | tr '\n' ' ')" = "latest step-00000010 " ]; then
    pass "a crashed save's step-00000007.tmp is ignored (the run resumes from step 5, byte-identical) and removed by the next save"
else
    fail "resume next to a crashed save" "$(grep -m2 error "$T/crashed2.out")" "left: $(ls "$T/crashed2" | tr '\n' ' ')"
fi

# A full disk: the save at step 7 cannot write rank 0's file (ulimit -f: files up to 100 KiB,
# SIGXFSZ ignored by the trainer, so the write fails with EFBIG). Both ranks stop with an error
# (rank 0 names the file, rank 1 says another rank failed), the step-7 directory is gone, latest
# still names step 5, and a resume from it is exact.
rm -rf "$T/full"
cp -r "$T/crashed" "$T/full"
rm -rf "$T/full/step-00000007.tmp"
# (the limit is set inside each rank: on mpirun itself it would also cap MPI's shared-memory files,
# hence the tcp transport here)
# shellcheck disable=SC2086
timeout 300 mpirun --oversubscribe --mca btl self,tcp -np 2 bash -c "ulimit -f 100; exec ./train_gpt2cpu $D $MODEL $QUIET --resume $T/full --save-state $T/full --save-state-every 7" >"$T/full.out" 2>&1
rc=$?
left=$(ls "$T/full" | tr '\n' ' ')
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c "keeps the previous state, step-00000005" "$T/full.out")" -eq 2 ] && grep -q "File too large" "$T/full.out" &&
   [ "$left" = "latest step-00000005 " ]; then
    pass "a save into a full disk: exit $rc, '$(grep -m1 'keeps the previous' "$T/full.out" | cut -c1-120)'; left: $left"
else
    fail "a save into a full disk" "exit $rc, left: $left" "$(grep -m2 error "$T/full.out")"
fi
if $MPIRUN -np 1 ./train_gpt2cpu $D $MODEL $QUIET --resume "$T/full" --log "$T/full.log" >"$T/full2.out" 2>&1 && cmp -s "$T/full.log" "$T/one-rank/a.log"; then
    pass "after the failed save the previous state resumes byte-identically"
else
    fail "resume after the failed save" "$(grep -m2 error "$T/full2.out")"
fi

# ---- bad state directories: one line on every rank, non-zero exit, no hang
S="$T/crashed"   # a good one-rank state at step 5 (and the crashed .tmp beside it)
mk_bad() { rm -rf "$T/bad-$1"; cp -r "$S" "$T/bad-$1"; echo "$T/bad-$1"; }
B=$(mk_bad nolatest); rm "$B/latest"
expect_all "state with no 'latest'" "holds no complete training state" 2 ./train_gpt2cpu $D $MODEL $QUIET --resume "$B"
B=$(mk_bad nomanifest); rm "$B/step-00000005/manifest"
expect_all "step directory without a manifest" "which has no manifest" 2 ./train_gpt2cpu $D $MODEL $QUIET --resume "$B"
B=$(mk_bad corrupt); printf '\x55' | dd of="$B/step-00000005/rank-00000.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
expect_all "corrupt rank file" "is corrupt: its checksum" 2 ./train_gpt2cpu $D $MODEL $QUIET --resume "$B"
B=$(mk_bad truncated); truncate -s -100 "$B/step-00000005/rank-00000.bin"
expect_all "truncated rank file" "the manifest says .*: truncated" 2 ./train_gpt2cpu $D $MODEL $QUIET --resume "$B"
expect_all "another model's state" "holds a model with --layers 4, the flags say 3" 2 ./train_gpt2cpu $D $MODEL $QUIET --layers 3 --resume "$S"
expect_all "another run's state" "the state was saved by a run with" 2 ./train_gpt2cpu $D $MODEL $QUIET --batch 16 --resume "$S"
expect_all "a state that does not split on the new mesh" "tensor parallelism 3 does not divide the 4 attention heads" 3 ./train_gpt2cpu $D $MODEL $QUIET --tp 3 --resume "$S"
expect_all "--resume of a file" "is a file, expected a directory" 2 ./train_gpt2cpu $D $MODEL $QUIET --resume "$S/latest"
expect_all "--resume of a missing directory" "no such directory" 2 ./train_gpt2cpu $D $MODEL $QUIET --resume "$T/nowhere"

# ---- one job per state directory (llmc/train/state_lock.h): a second job is refused at once, naming
# the first; the first, ended by SIGTERM, leaves no lock; a lock whose process is gone (this host)
# is taken over, with a line saying so, and the run then saves and ends without a lock
L="$T/lock-busy"
rm -rf "$L"
./train_gpt2cpu $D $MODEL $QUIET --steps 100000 --save-state "$L" >"$T/lock-first.out" 2>&1 &
first=$!
for _ in $(seq 100); do [ -e "$L/lock" ] && break; sleep 0.1; done
./train_gpt2cpu $D $MODEL $QUIET --steps 2 --save-state "$L" >"$T/lock-second.out" 2>&1
rc=$?
kill -TERM $first 2>/dev/null
wait $first 2>/dev/null
if [ $rc != 0 ] && grep -q "^error: --save-state '$L' is in use by another job: host $(hostname), process $first " "$T/lock-second.out" &&
   [ ! -e "$L/lock" ]; then
    pass "a second job on one --save-state: refused at once naming host and process $first; the first, ended by SIGTERM, left no lock"
else
    fail "a second job on one --save-state (exit $rc; lock left: $([ -e "$L/lock" ] && echo yes || echo no))" "$(tail -1 "$T/lock-second.out")"
fi
L="$T/lock-stale"
rm -rf "$L"
mkdir -p "$L"
sh -c 'exit 0' &
dead=$!
wait $dead
echo "$(hostname) $dead" >"$L/lock"
if ./train_gpt2cpu $D $MODEL $QUIET --steps 2 --save-state "$L" >"$T/lock-stale.out" 2>&1 &&
   grep -q "'$L/lock' was left by process $dead on this host, which is gone: taken over" "$T/lock-stale.out" &&
   [ -f "$L/latest" ] && [ ! -e "$L/lock" ]; then
    pass "a stale lock (process $dead, gone) taken over with a line; the run saved its state and released the lock"
else
    fail "a stale lock taken over" "$(grep -m2 'lock\|error' "$T/lock-stale.out")"
fi

# ---- bad data found mid-run (llmc/train/data_ahead.h): a dataset of more than 2^26 tokens (its third
# shard sparse) is checked as the run reaches it. Its second shard, reached at step 4, holds a token
# outside the vocabulary: both ranks stop before step 4 naming it, the state of step 3 saved; the
# shard fixed (same length), the resumed run's --log is the bytes of a whole run on the fixed data.
W="$T/late"
rm -rf "$W"
mkdir -p "$W/data" "$W/fixed"
python3 - "$T/data/train_000000.bin" "$W" <<'PY'
import struct, sys
src, w = sys.argv[1], sys.argv[2]
head = lambda n: struct.pack("<3i", 20240520, 1, n) + bytes(1024 - 12)
n0 = 3 * 8 * 32 + 1                                     # three global micro-batches of 8 x 32, and the last target
tokens = open(src, "rb").read()[1024:1024 + 2 * n0]
for d, last in (("data", 300), ("fixed", 65)):
    open(f"{w}/{d}/late_000000.bin", "wb").write(head(n0) + tokens)
    open(f"{w}/{d}/late_000001.bin", "wb").write(head(300) + struct.pack("<300H", *([65] * 299 + [last])))
    with open(f"{w}/{d}/late_000002.bin", "wb") as f:   # 2^26 tokens of 0, none of them on disk
        f.write(head(1 << 26))
        f.truncate(1024 + 2 * (1 << 26))
PY
LATE="--val-data $T/data/val_*.bin $MODEL $QUIET --steps 6"
# shellcheck disable=SC2086
$MPIRUN -np 2 --tag-output ./train_gpt2cpu --train-data "$W/data/late_*.bin" $LATE --save-state "$W/S" >"$W/stop.out" 2>&1
rc=$?
cp "$W/fixed/late_000001.bin" "$W/data/"
# shellcheck disable=SC2086
if [ $rc != 0 ] && grep -q "error: \[rank 0\] '$W/data/late_000001.bin': token 300 at position 299 is outside the model's vocabulary of 257: found before step 4, which would read it; the training state is saved in '$W/S' (step 3)" "$W/stop.out" &&
   [ "$(cat "$W/S/latest" 2>/dev/null)" = step-00000003 ] &&
   $MPIRUN -np 2 ./train_gpt2cpu --train-data "$W/data/late_*.bin" $LATE --resume "$W/S" --log "$W/b.log" >"$W/b.out" 2>&1 &&
   $MPIRUN -np 2 ./train_gpt2cpu --train-data "$W/fixed/late_*.bin" $LATE --log "$W/a.log" >"$W/a.out" 2>&1 &&
   cmp -s "$W/a.log" "$W/b.log" && [ "$(wc -l <"$W/b.log")" -eq 6 ]; then
    pass "a bad token found mid-run (shard 2 of a 2^26-token set): exit $rc before step 4 with step 3 saved; fixed and resumed, the --log is the whole run's"
else
    fail "a bad token found mid-run (exit $rc, latest: $(cat "$W/S/latest" 2>/dev/null))" "$(grep -h -m2 error "$W"/*.out)"
fi

# ---- the tests can fail: a resume that forgets part of the state must differ
if [ "${STATE_PERTURB:-1}" = 1 ]; then
    perturb_resume() {
        local label=$1
        perturbed_build "$label" || return
        local dir="$T/perturbed"
        if resume 2 "perturbed-run" "$dir/train" -- --zero 1; then
            fail "perturbation '$label' went unnoticed: the resumed log is still identical"
        else
            pass "perturbation '$label' fails the bit-exact resume: step $(diff "$T/perturbed-run/a.log" "$T/perturbed-run/b.log" | sed -n 2p | cut -c3-60)"
        fi
    }
    # (test/perturbations.py: the data position, AdamW's t and its moment m left as the fresh run has them)
    perturb_resume "data position not restored"
    perturb_resume "AdamW t not restored"
    perturb_resume "AdamW m not restored"
fi
