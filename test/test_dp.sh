#!/usr/bin/env bash
# Data parallelism (llmc/parallel/) against the single-rank run, on CPU ranks in fp32:
#   - equivalence: for np in 2 3 4, every mode (naive, bucketed DDP with 1, 2 and 4 buckets,
#     parameter server with 1 and 2 servers, ZeRO-1, ZeRO-2, ZeRO-3, ZeRO-Offload) and 1 and 2
#     micro-steps: 6 steps whose losses, gradient norms and final parameters match the
#     single-rank run within 1e-5 relative (test/compare_runs.py says how). Six steps carry
#     every piece of state across steps (AdamW's m, v and t, ZeRO's shards, the buckets, the data
#     position) and pass the end of the 5-step warmup;
#   - in every such run: the memory table's measured bytes equal the formula on every rank,
#     and every step's counted communication equals the formula;
#   - the trace: valid JSON with a compute and a communication track per rank, and DDP's overlap
#     in program order: each backward pass hands a bucket's all-reduce to the communication
#     thread while backward blocks are still to run (the compute track's own order, not times);
#   - bad input: a clear message on every rank, non-zero exit, no hang.
set -u
cd "$(dirname "$0")/.."
T=build/dp-test
rm -rf "$T"
mkdir -p "$T"
WHAT="data parallelism"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 4000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
# 3 layers of C 64: blocks of 0.19 MiB and a root (wte, wpe, lnf) of 0.11 MiB, so --bucket-mb
# 10 gives 1 bucket, 0.4 gives 2 and 0.1 gives 4. Batch 24 splits over 2, 3, 4 ranks x 2 micro-steps;
# sequences of 16 tokens (nothing here depends on their length: half the compute of 32).
STEPS=6
MODEL="--layers 3 --heads 2 --channels 64 --batch 24 --seq 16 --steps $STEPS --lr 1e-3 --warmup 5"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"
TRAIN="./train_gpt2cpu $D $MODEL $QUIET"

# the single-rank references (no mpirun, no data-parallel code involved)
for micro in 1 2; do
    $TRAIN --grad-accum $micro --log "$T/ref$micro.log" --save "$T/ref$micro.bin" >"$T/ref$micro.out" 2>&1 ||
        { echo "FAIL single-rank reference run (micro $micro): $(tail -2 "$T/ref$micro.out")"; exit 1; }
done

MODES=("naive|--dp-mode naive"
       "ddp, 1 bucket|--bucket-mb 10"
       "ddp, 2 buckets|--bucket-mb 0.4"
       "ddp, 4 buckets|--bucket-mb 0.1"
       "parameter server, 1 server|--dp-mode ps --ps-servers 1"
       "parameter server, 2 servers|--dp-mode ps --ps-servers 2"
       "ZeRO-1, 2 buckets|--zero 1 --bucket-mb 0.4"
       "ZeRO-2, 4 buckets|--zero 2 --bucket-mb 0.1"
       "ZeRO-2, 1 bucket|--zero 2 --bucket-mb 10"
       "ZeRO-3|--zero 3"
       "ZeRO-2 + offload|--zero 2 --offload --bucket-mb 0.4")
for np in 2 3 4; do
    for micro in 1 2; do
        for entry in "${MODES[@]}"; do
            name=${entry%%|*}
            flags=${entry#*|}
            tag="np $np, $name, $micro micro-step(s)"
            out="$T/run.out"
            rm -f "$T/run.log" "$T/run.bin"
            # shellcheck disable=SC2086
            if ! $MPIRUN -np "$np" $TRAIN --grad-accum $micro $flags --log "$T/run.log" --save "$T/run.bin" >"$out" 2>&1; then
                fail "$tag: the run failed" "$(grep -v '^\s*$' "$out" | tail -3)"
                continue
            fi
            python3 test/compare_runs.py "$T/ref$micro.log" "$T/ref$micro.bin" "$T/run.log" "$T/run.bin" --label "$tag matches 1 rank"
            if ! grep -q "memory check ok" "$out"; then
                fail "$tag: memory table" "$(grep -A8 'memory per rank' "$out")"
            fi
            steps=$(grep -c "comm | sent .* equal)" "$out")
            if [ "$steps" -ne $STEPS ]; then
                fail "$tag: counted communication = formula in $steps of $STEPS steps" "$(grep -m2 'comm |' "$out")"
            fi
        done
    done
    # one line per np that summarises the memory/communication checks that passed silently
    pass "np $np: every mode's memory table (measured = formula on every rank) and per-step bytes (counted = formula) checked"
done

# --- --comm-algo auto (llmc/comm/auto.h) with a tuning file whose rows make two algorithms
# share the 4 buckets by size (0.11 and 0.19 MiB): the bytes of each step equal the chosen ones'
# formulas, and the run the single-rank one
printf '%s\n' "allreduce 3 3 0 150000 - ring" "allreduce 3 3 150001 999999999 - recursive_doubling" \
    "allreduce 4 4 0 150000 - recursive_doubling" "allreduce 4 4 150001 999999999 - rabenseifner" >"$T/tuning.txt"
for np in 3 4; do
    tag="np $np, --comm-algo auto with a tuning file, 4 buckets"
    rm -f "$T/run.log" "$T/run.bin"
    if $MPIRUN -np $np $TRAIN --bucket-mb 0.1 --comm-algo auto --comm-tuning "$T/tuning.txt" --log "$T/run.log" --save "$T/run.bin" \
        >"$T/auto.out" 2>&1; then
        python3 test/compare_runs.py "$T/ref1.log" "$T/ref1.bin" "$T/run.log" "$T/run.bin" --label "$tag matches 1 rank"
        steps=$(grep -c "comm | sent .* equal)" "$T/auto.out")
        if [ "$steps" -eq $STEPS ] && grep -q "^comm  *auto (ours" "$T/auto.out"; then
            pass "$tag: counted bytes = the chosen algorithms' formulas in all $STEPS steps ($(grep -m1 -o 'sent .* MiB by' "$T/auto.out"))"
        else
            fail "$tag: counted communication = formula in $steps of $STEPS steps" "$(grep -m2 'comm' "$T/auto.out")"
        fi
    else
        fail "$tag: the run failed" "$(grep -v '^\s*$' "$T/auto.out" | tail -3)"
    fi
done

# --- what the memory table says for ZeRO-3 on 4 ranks: the lecture's (2a + K) Psi / N per rank
$MPIRUN -np 4 $TRAIN --zero 3 --steps 1 >"$T/z3.out" 2>&1
psi_pad=$(sed -n 's/.*(\([0-9]*\) padded).*/\1/p' "$T/z3.out" | head -1)
got=$(awk '/^  parameters/ {p=$2} /^  gradients/ {g=$2} /^  optimizer/ {o=$4} END {printf "%.6f", p + g + o}' "$T/z3.out")
want=$(python3 -c "print('%.6f' % ((4 + 4 + 8) * $psi_pad / 4 / 1048576))")
if [ -n "$psi_pad" ] && python3 -c "import sys; sys.exit(abs($got - $want) > 0.002)"; then
    pass "ZeRO-3 on 4 ranks: parameters + gradients + optimizer = (4 + 4 + 8) Psi_pad / 4 = $want MiB per rank"
else
    fail "ZeRO-3 memory per rank" "got $got MiB, want $want MiB" "$(grep -A7 'memory per rank' "$T/z3.out")"
fi

# --- the trace: both tracks on every rank, and DDP's buckets handed to the communication thread
# while the backward goes on. Judged in program order: on each rank's compute track (one thread,
# its events in the order they happened) every backward pass has a "hand over all-reduce bucket"
# before its last "backward block" event. When the communication thread then starts the
# all-reduce depends on the load, so the all-reduces that start inside the backward are printed,
# not judged.
$MPIRUN -np 2 ./train_gpt2cpu $D $QUIET --batch 16 --seq 64 --steps 3 --bucket-mb 0.5 --trace "$T/trace.json" >"$T/trace.out" 2>&1
python3 - "$T/trace.json" <<'EOF'
import json, sys
try:
    ev = json.load(open(sys.argv[1]))["traceEvents"]
except Exception as e:
    print(f"FAIL trace: not valid JSON ({e})"); sys.exit(0)
x = [e for e in ev if e["ph"] == "X"]
tracks = {(e["pid"], e["tid"]) for e in x}
passes_ok, passes = 0, 0
for pid in sorted({e["pid"] for e in x}):
    compute = [e["name"] for e in x if e["pid"] == pid and e["tid"] == 0]   # in the order recorded
    run = []   # one backward pass: consecutive "backward block" and "hand over" events
    for name in compute + ["end"]:
        if name.startswith("backward block") or name.startswith("hand over"):
            run.append(name)
        elif run:
            passes += 1
            hand = [i for i, n in enumerate(run) if n.startswith("hand over")]
            blocks = [i for i, n in enumerate(run) if n.startswith("backward block")]
            passes_ok += bool(hand) and bool(blocks) and hand[0] < blocks[-1]
            run = []
back = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in x if e["name"] == "backward"]
comm = [(e["pid"], e["ts"]) for e in x if e["name"].startswith("all-reduce bucket")]
timed = sum(1 for p, t in comm if any(p == q and s <= t < f for q, s, f in back))
ok = tracks >= {(0, 0), (0, 1), (1, 0), (1, 1)} and passes > 0 and passes_ok == passes
print(f"{'PASS' if ok else 'FAIL'} trace: {len(x)} events on tracks {sorted(tracks)}; in {passes_ok} of {passes} "
      f"backward passes a bucket went to the communication thread before the last block's backward "
      f"(this time {timed} of {len(comm)} all-reduces started while the backward ran)")
EOF

# --- bad input: every rank reports, all exit non-zero, no hang
expect_all "global batch that does not divide among 4 ranks" "does not split into" 4 $TRAIN --batch 6
expect_all "ZeRO stage out of range" "--zero must be 0, 1, 2 or 3" 2 $TRAIN --zero 4
expect_all "--offload without ZeRO-1/2" "--offload needs --zero 1 or --zero 2" 2 $TRAIN --offload
expect_all "a mesh that does not match the ranks" "but mpirun started" 2 $TRAIN --dp 3
expect_all "--comm-algo auto with ZeRO" "--comm-algo auto is built for --dp-mode ddp without --zero" 2 $TRAIN --comm-algo auto --zero 1
expect_all "a missing tuning file" "cannot read the tuning file" 2 $TRAIN --comm-algo auto --comm-tuning $T/no_such_tuning.txt
expect_all "more servers than ranks" "at most the 2 data-parallel ranks" 2 $TRAIN --dp-mode ps --ps-servers 3
expect_all "ZeRO with the parameter server" "does not combine" 2 $TRAIN --dp-mode ps --zero 1
expect_all "unknown --dp-mode" "--dp-mode must be" 2 $TRAIN --dp-mode fsdp
exit 0
