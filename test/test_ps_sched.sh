#!/usr/bin/env bash
# Layer-wise scheduling (llmc/parallel/dp_priority.h: --comm-chunk-kb, --comm-order) on CPU ranks:
#   - the parameter server in chunks, fifo or by priority, gives BIT FOR BIT the plain server's
#     run (same --log, same checkpoint: cmp), for 1 and 2 servers and 1 and 2 micro-steps;
#   - DDP's all-reduce in chunks: priority and fifo give bit-identical runs, and both match one rank;
#   - every step's counted bytes equal the formula;
#   - the schedule's logical order, counted in chunks (never in milliseconds, so the same on every
#     run whatever the load): by priority every pull goes root, block 0, 1, ... and the forward of
#     block 0 waits only for the root's and block 0's chunks, fewer than the pull's; fifo pulls
#     the root last and block 0 waits for the whole pull. Read twice: from the trainer's step lines
#     (the communication thread's count) and from the order of the --trace's events
#     (test/ps_sched_trace.py), on every rank;
#   - perturbations (the priority ignored; a push summed in another order) fail;
#   - bad input: a clear message on every rank.
# The time from the update to the next forward (priority below fifo) depends on the machine's
# load: scripts/lab_ps.sh measures it, this test does not.
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
STEPS=6   # past the warmup, 5 pulls followed by a step
MODEL="--layers 3 --heads 2 --channels 64 --batch 24 --seq 32 --steps $STEPS --lr 1e-3 --warmup 3"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"
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
    if [ "$steps" -ne "$STEPS" ]; then
        fail "$name: counted bytes = formula in $steps of $STEPS steps" "$(grep -m3 'comm |' "$T/$name.out")"
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

# pulls ORDER NAME: do the trainer's step lines of $T/NAME.out show, after every update but the
# last, the pull in ORDER's logical order (3 blocks)? By priority root, block 0, 1, 2, and the
# forward of block 0 waited for the root's and block 0's chunks only, fewer than all; fifo
# block 2, 1, 0, root, and block 0 waited for all. Prints "K of the N" (block 0 waited for K of
# the pull's N chunks) when every pull is so, else what is wrong.
pulls() {
    local order=$1 want
    if [ "$order" = priority ]; then want="root, block 0, block 1, block 2"; else want="block 2, block 1, block 0, root"; fi
    sed -n 's/.*sched | the previous update.s pull: \(.*\) | the forward of block 0 waited for \([0-9]*\) of the \([0-9]*\) chunks (the root.s and block 0.s: \([0-9]*\)).*/\1|\2|\3|\4/p' "$T/$2.out" |
        awk -F'|' -v want="$want" -v order="$order" -v pulls=$((STEPS - 1)) -v name="$2" '
            {n++; ok = $1 == want && (order == "priority" ? $2 == $4 && $2 < $3 : $2 == $3)
             if (!ok && !bad) bad = "pull " n ": " $1 "; block 0 waited for " $2 " of " $3 " (the root\047s and its own: " $4 ")"
             if (!ok) b++; facts = $2 " of the " $3}
            END {if (n != pulls) print name ": " n " of " pulls " pulls reported"; else if (b) print name ": " b " pulls differ, " bad
                 else print facts}'
}
# ---- the parameter server: chunks change the order of the messages, not one sum
declare -A SCHED=([fifo]="" [priority]="")   # per order: what its runs' pulls showed
for servers in 1 2; do
    for micro in 1 2; do
        tag="s${servers}m$micro"
        run "plain-$tag" 3 --dp-mode ps --ps-servers $servers --grad-accum $micro || continue
        for order in fifo priority; do
            trace=""
            [ "$tag" = s1m1 ] && trace="--trace $T/$order.json"
            # shellcheck disable=SC2086
            run "$order-$tag" 3 --dp-mode ps --ps-servers $servers --grad-accum $micro --comm-chunk-kb 16 --comm-order $order $trace || continue
            same "np 3, $servers server(s), $micro micro-step(s): chunks by $order = the plain parameter server" "plain-$tag" "$order-$tag"
            SCHED[$order]+="$tag: $(pulls $order "$order-$tag")"$'\n'
        done
    done
done

# ---- the schedule's order, counted: the trainer's lines for every run above, the trace of one
for order in fifo priority; do
    if [ "$order" = priority ]; then
        what="every pull went root, block 0, 1, 2 and the forward of block 0 waited for the root's and block 0's chunks only"
    else
        what="every pull went block 2, 1, 0, root and the forward of block 0 waited for the whole pull"
    fi
    got=$(printf '%s' "${SCHED[$order]}" | sort -u)
    if [ "$(printf '%s\n' "$got" | grep -cE '^s[12]m[12]: [0-9]+ of the [0-9]+$')" -eq 4 ]; then
        pass "schedule, $order (1-2 servers, 1-2 micro-steps, $((STEPS - 1)) pulls each): $what ($(printf '%s' "$got" | tr '\n' ';' | sed 's/;$//; s/;/; /g') chunks)"
    else
        mapfile -t lines <<<"$got"
        fail "schedule, $order: the trainer's step lines do not show the expected pulls" "${lines[@]}"
    fi
    if [ -f "$T/$order.json" ] && python3 test/ps_sched_trace.py "$T/$order.json" --expect $order >"$T/trace-$order.txt"; then
        pass "trace, $order: $(head -1 "$T/trace-$order.txt" | sed 's/^rank 0: //') (the same on all 3 ranks)"
    else
        fail "trace, $order: the expected schedule is not there" "$(cat "$T/trace-$order.txt" 2>/dev/null)"
    fi
done

# ---- DDP: the order of the chunks does not change any sum
ref one
if run ddp-fifo 3 --bucket-mb 0.2 --comm-chunk-kb 16 && run ddp-priority 3 --bucket-mb 0.2 --comm-chunk-kb 16 --comm-order priority; then
    same "DDP, 4 buckets in 16 KiB chunks: priority = fifo" ddp-fifo ddp-priority
    python3 test/compare_runs.py "$T/one.log" "$T/one.bin" "$T/ddp-priority.log" "$T/ddp-priority.bin" --label "DDP in chunks by priority matches 1 rank"
fi

# ---- the checks can fail
if perturbed_build "priority ignored"; then   # (test/perturbations.py)
    # shellcheck disable=SC2086
    $MPIRUN -np 3 "$T/perturbed/train" $D $MODEL $QUIET --dp-mode ps --comm-chunk-kb 16 --comm-order priority --trace "$T/p.json" >"$T/p.out" 2>&1
    got=$(pulls priority p)
    if python3 test/ps_sched_trace.py "$T/p.json" --expect priority >"$T/p.txt" || [[ $got =~ ^[0-9]+\ of\ the ]]; then
        fail "perturbation 'priority ignored' went unnoticed" "step lines: $got" "$(head -2 "$T/p.txt")"
    else
        pass "perturbation 'priority ignored' fails the step lines ($got) and the trace check ($(head -1 "$T/p.txt" | sed 's/^rank 0: //' | cut -c1-60)...)"
    fi
fi
if perturbed_build "push summed in another order"; then   # (test/perturbations.py)
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
