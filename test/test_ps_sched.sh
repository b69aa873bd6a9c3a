#!/usr/bin/env bash
# Layer-wise scheduling (llmc/parallel/dp_sched.h: --comm-chunk-kb, --comm-order) on CPU ranks:
#   - the parameter server in chunks, fifo or by priority, gives BIT FOR BIT the plain server's
#     run (same --log, same checkpoint: cmp), for 1 and 2 servers and 1 and 2 micro-steps;
#   - DDP's all-reduce in chunks: priority and fifo give bit-identical runs, and both match one rank;
#   - every step's counted bytes equal the formula;
#   - the trace: by priority the pull goes root, block 0, 1, ... and the next forward of block 0
#     starts before the last parameter chunk has arrived, after every update; fifo pulls the root
#     last and the forward never starts early;
#   - the measured time from the update to the next forward of block 0: priority below fifo;
#   - perturbations (the priority ignored; a push summed in another order) fail;
#   - bad input: a clear message on every rank.
set -u
cd "$(dirname "$0")/.."
T=build/ps-sched-test
rm -rf "$T"
mkdir -p "$T"
WHAT="layer-wise scheduling"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 4000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
MODEL="--layers 3 --heads 2 --channels 64 --batch 24 --seq 32 --steps 10 --lr 1e-3 --warmup 5"
QUIET="--eval-every 0 --accuracy 0 --sample-every 0 --threads 1"
TRAIN="./train_gpt2cpu $D $MODEL $QUIET"

# run NAME NP FLAGS...: $T/NAME.{out,log,bin}; returns 1 (after a FAIL) when it fails or a step's bytes differ
run() {
    local name=$1 np=$2; shift 2
    # shellcheck disable=SC2086
    if ! $MPIRUN -np "$np" $TRAIN "$@" --log "$T/$name.log" --save "$T/$name.bin" >"$T/$name.out" 2>&1; then
        fail "$name: the run failed" "$(grep -v '^\s*$' "$T/$name.out" | tail -3)"
        return 1
    fi
    local steps
    steps=$(grep -c "comm | sent .* equal)" "$T/$name.out")
    if [ "$steps" -ne 10 ]; then
        fail "$name: counted bytes = formula in $steps of 10 steps" "$(grep -m3 'comm |' "$T/$name.out")"
        return 1
    fi
}
same() {   # same LABEL A B: identical logs and checkpoints
    if cmp -s "$T/$2.bin" "$T/$3.bin" && cmp -s "$T/$2.log" "$T/$3.log"; then
        pass "$1: bit for bit (log and checkpoint), bytes = formula every step"
    else
        fail "$1: the runs differ" "$(diff "$T/$2.log" "$T/$3.log" | head -4)"
    fi
}

# ---- the parameter server: chunks change the order of the messages, not one sum
for servers in 1 2; do
    for micro in 1 2; do
        tag="s${servers}m$micro"
        run "plain-$tag" 3 --dp-mode ps --ps-servers $servers --grad-accum $micro || continue
        for order in fifo priority; do
            run "$order-$tag" 3 --dp-mode ps --ps-servers $servers --grad-accum $micro --comm-chunk-kb 16 --comm-order $order || continue
            same "np 3, $servers server(s), $micro micro-step(s): chunks by $order = the plain parameter server" "plain-$tag" "$order-$tag"
        done
    done
done

# ---- DDP: the order of the chunks does not change any sum
ref one
if run ddp-fifo 3 --bucket-mb 0.2 --comm-chunk-kb 16 && run ddp-priority 3 --bucket-mb 0.2 --comm-chunk-kb 16 --comm-order priority; then
    same "DDP, 4 buckets in 16 KiB chunks: priority = fifo" ddp-fifo ddp-priority
    python3 test/compare_runs.py "$T/one.log" "$T/one.bin" "$T/ddp-priority.log" "$T/ddp-priority.bin" --label "DDP in chunks by priority matches 1 rank"
fi

# ---- the trace and the time to the next forward (6 layers, so that the pull is long)
M6="--layers 6 --heads 2 --channels 64 --batch 24 --seq 32 --steps 12 --lr 1e-3 --warmup 5"
for order in fifo priority; do
    # shellcheck disable=SC2086
    $MPIRUN -np 3 ./train_gpt2cpu $D $M6 $QUIET --dp-mode ps --comm-chunk-kb 8 --comm-order $order --trace "$T/$order.json" >"$T/trace-$order.out" 2>&1 ||
        { fail "trace run ($order) failed" "$(tail -3 "$T/trace-$order.out")"; continue; }
    if python3 test/ps_sched_trace.py "$T/$order.json" --expect $order >"$T/trace-$order.txt"; then
        pass "trace, $order: $(head -1 "$T/trace-$order.txt" | sed 's/^rank 0: //')"
    else
        fail "trace, $order: the expected schedule is not there" "$(cat "$T/trace-$order.txt")"
    fi
done
ff=$(sed -n 's/.*fifo, [0-9]* steps): the next forward started \([0-9.]*\) ms.*/\1/p' "$T/trace-fifo.out")
fp=$(sed -n 's/.*priority, [0-9]* steps): the next forward started \([0-9.]*\) ms.*/\1/p' "$T/trace-priority.out")
if [ -n "$ff" ] && [ -n "$fp" ] && python3 -c "import sys; sys.exit(not ($fp < $ff))"; then
    pass "update -> next forward of block 0: $fp ms by priority, $ff ms fifo"
else
    fail "update -> next forward of block 0: priority '$fp' ms is not below fifo '$ff' ms" "$(grep 'layer-wise pull' "$T"/trace-*.out)"
fi

# ---- the checks can fail
if perturbed_build "priority ignored" llmc/parallel/dp_core.h "if (dp->task_prio[i] < dp->task_prio[best])" "if (0)"; then
    # shellcheck disable=SC2086
    $MPIRUN -np 3 "$T/perturbed/train" $D $M6 $QUIET --dp-mode ps --comm-chunk-kb 8 --comm-order priority --steps 4 --trace "$T/p.json" >"$T/p.out" 2>&1
    if python3 test/ps_sched_trace.py "$T/p.json" --expect priority >"$T/p.txt"; then
        fail "perturbation 'priority ignored' went unnoticed" "$(cat "$T/p.txt")"
    else
        pass "perturbation 'priority ignored' fails the trace check: $(head -1 "$T/p.txt" | cut -c1-90)"
    fi
fi
if perturbed_build "push summed in another order" llmc/parallel/dp_sched.h "comm_recv(comm, inc, c.count, COMM_FLOATX, (r - k + p) % p);" "comm_recv(comm, inc, c.count, COMM_FLOATX, (r + k) % p);"; then
    $MPIRUN -np 3 "$T/perturbed/train" $D $MODEL $QUIET --dp-mode ps --comm-chunk-kb 16 --comm-order priority --log "$T/p.log" --save "$T/p.bin" >"$T/p.out" 2>&1
    if cmp -s "$T/p.bin" "$T/plain-s1m1.bin"; then
        fail "perturbation 'push summed in another order' went unnoticed"
    else
        pass "perturbation 'push summed in another order' is not bit for bit the plain server"
    fi
fi

# ---- bad input
expect_all "--comm-order without chunks" "orders chunks: add --comm-chunk-kb" 2 $TRAIN --dp-mode ps --comm-order priority
expect_all "--comm-chunk-kb with ZeRO" "schedules the parameter server" 2 $TRAIN --zero 1 --comm-chunk-kb 16
expect_all "--comm-chunk-kb negative" "must be >= 0 KiB" 2 $TRAIN --dp-mode ps --comm-chunk-kb -4
expect_all "--comm-order unknown" "must be fifo or priority" 2 $TRAIN --dp-mode ps --comm-chunk-kb 4 --comm-order lifo
