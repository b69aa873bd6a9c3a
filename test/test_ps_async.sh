#!/usr/bin/env bash
# The asynchronous / stale synchronous parameter server (llmc/parallel/dp_ps_async.h) and the
# straggler injector (llmc/train/straggler.h), on 4 CPU ranks in fp32:
#   - --staleness 0 is the synchronous parameter server (--dp-mode ps --ps-servers 1) bit for bit:
#     the same --save checkpoint (cmp) and, per step, the same mean loss and gradient norm
#     (the sync run's --log against the server's --ps-log), memory table and bytes = formula;
#     also with the held straggler (the order the pushes come in changes no sum);
#   - the held straggler (--straggler hold:1: the server serves rank 1 only when no other worker
#     can move, the worst schedule the bound allows, the same on every run), counted from
#     --ps-log and the summary, never from times:
#       SSP, S = 1 and 2: the bound is reached (every gradient of the others from clock S on is
#       exactly S stale: the whole histogram is known), the others are held back by the bound at
#       every clock from S on and never go on more than S steps ahead of rank 1 (it sets the pace);
#       async: the others do all their steps before the server takes rank 1's first push, which
#       is then 3 x steps updates stale (it does not set the pace);
#       and S = 2 run twice gives the same checkpoint (a sleeping straggler's would differ);
#   - the bound holds with a sleeping straggler too (random:MS: whatever the timing, <= S);
#   - bad input and runtime checks: a clear message, non-zero exit, no hang;
#   - perturbations (the pushes summed in another order; no staleness wait) that must fail.
# The wall times and step rates with a straggler (S = 1 and async faster than S = 0; a persistent
# straggler sets the pace of SSP, not of async) depend on the machine's load:
# scripts/lab_ps_async.sh measures them, this test does not.
set -u
cd "$(dirname "$0")/.."
T=build/ps-async-test
rm -rf "$T"
mkdir -p "$T"
WHAT="the asynchronous parameter server"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all, perturbed_build; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 4000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
STEPS=6   # past the warmup; with the held straggler, clocks beyond S = 2
MODEL="--layers 3 --heads 2 --channels 64 --batch 24 --seq 32 --steps $STEPS --lr 1e-3 --warmup 3"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"
TRAIN="./train_gpt2cpu $D $MODEL $QUIET"

# run NAME FLAGS...: 4 ranks into $T/NAME.out (.log, .bin, .plog with --ps-log)
run() {
    local name=$1; shift
    # shellcheck disable=SC2086
    $MPIRUN -np 4 $TRAIN "$@" >"$T/$name.out" 2>&1 || { fail "$name: the run failed" "$(grep -v '^\s*$' "$T/$name.out" | tail -3)"; return 1; }
}
# same_steps SYNC_LOG PS_LOG: the per-step loss and norm of the synchronous run's --log and the
# server's --ps-log are the same strings (%.9g: the same floats)
same_steps() {
    paste -d' ' <(awk '{print $2, $3}' "$1") <(grep -v '^#' "$2" | awk '{print $4, $5}') |
        awk 'NF != 4 || $1 != $3 || $2 != $4 {d++; if (!w) w = NR ": " $0} END {if (d || NR == 0) {print "step " w; exit 1}}'
}

# --- 1. S = 0 against the synchronous parameter server
run sync --dp-mode ps --ps-servers 1 --log "$T/sync.log" --save "$T/sync.bin" || exit 1
run s0 --dp-mode ps --staleness 0 --ps-log "$T/s0.plog" --save "$T/s0.bin" || exit 1
if cmp -s "$T/sync.bin" "$T/s0.bin"; then
    pass "--staleness 0: the --save checkpoint is the synchronous server's byte for byte (cmp)"
else
    fail "--staleness 0: the checkpoint differs from --dp-mode ps --ps-servers 1" "$(cmp "$T/sync.bin" "$T/s0.bin" | head -1)"
fi
if d=$(same_steps "$T/sync.log" "$T/s0.plog"); then
    pass "--staleness 0: the mean loss and gradient norm of all $(grep -vc '^#' "$T/s0.plog") updates are the synchronous run's, bit for bit"
else
    fail "--staleness 0: per-step loss/norm differ from the synchronous server" "$d"
fi
checks=$(grep -c "memory check ok\|server     sent .* equal)\|workers    sent .* equal on all 4)" "$T/s0.out")
steps=$(grep -c "comm | sent .* equal)" "$T/s0.out")
if [ "$checks" -eq 3 ] && [ "$steps" -eq "$STEPS" ]; then
    pass "--staleness 0: memory table = formula on every rank; bytes = formula (rank 0 each step, the server and each worker in all)"
else
    fail "--staleness 0: memory/bytes checks ($checks of 3, $steps of $STEPS steps)" "$(grep -E 'memory check|server     sent|workers    sent' "$T/s0.out")"
fi
if run h0 --dp-mode ps --staleness 0 --straggler hold:1 --ps-log "$T/h0.plog" --save "$T/h0.bin"; then
    if cmp -s "$T/sync.bin" "$T/h0.bin" && same_steps "$T/sync.log" "$T/h0.plog" >/dev/null; then
        pass "--staleness 0 with rank 1 held (served last): still the synchronous server's checkpoint and per-step loss/norm, bit for bit"
    else
        fail "--staleness 0 with rank 1 held: differs from the synchronous server" "$(cmp "$T/sync.bin" "$T/h0.bin" | head -1)"
    fi
fi

# --- 2. the held straggler: what each mode does, counted
# staleness NAME: the histogram of the applied gradients' staleness in --ps-log ("0:9 1:15")
staleness() { grep -v '^#' "$T/$1.plog" | awk '{n = split($8, s, ","); for (i = 1; i <= n; i++) h[s[i]]++} END {for (k in h) print k ":" h[k]}' | sort -n | tr '\n' ' ' | sed 's/ $//'; }
# waits NAME: per worker 0..3, the pushes the bound held back ("5 0 5 5"); ahead NAME: the most steps a worker went on ahead
waits() { sed -n 's/^  worker [0-9] .*held back by the bound \([0-9]*\) times.*/\1/p' "$T/$1.out" | tr '\n' ' ' | sed 's/ $//'; }
ahead() { sed -n 's/^  ahead      a worker went on at most \([0-9]*\) step.*/\1/p' "$T/$1.out"; }
for S in 1 2; do
    run "h$S" --dp-mode ps --staleness "$S" --straggler hold:1 --ps-log "$T/h$S.plog" --save "$T/h$S.bin" || continue
    # rank 1 always computes on the newest version (staleness 0); the others' clock c is min(c, S) stale
    want=$(awk -v S="$S" -v T="$STEPS" 'BEGIN {h[0] = T; for (c = 0; c < T; c++) h[c < S ? c : S] += 3; for (k = 0; k <= S; k++) if (h[k]) printf "%s%d:%d", k ? " " : "", k, h[k]}')
    got=$(staleness "h$S")
    if [ "$got" = "$want" ] && [ "$(grep -vc '^#' "$T/h$S.plog")" -eq "$STEPS" ]; then
        pass "--staleness $S, rank 1 held: all $((4 * STEPS)) gradients at most $S stale and the bound reached, the histogram as the rule says ($got)"
    else
        fail "--staleness $S, rank 1 held: staleness histogram '$got', want '$want' over $STEPS updates" "$(grep 'staleness  ' "$T/h$S.out")"
    fi
    w=$((STEPS - S))
    if [ "$(waits "h$S")" = "$w 0 $w $w" ] && [ "$(ahead "h$S")" = "$S" ]; then
        pass "--staleness $S, rank 1 held: it sets the pace: every other worker held back by the bound at each of its last $w steps, none more than $S steps ahead of it"
    else
        fail "--staleness $S, rank 1 held: held back '$(waits "h$S")' (want '$w 0 $w $w'), ahead '$(ahead "h$S")' (want $S)"
    fi
done
# the same schedule on every run, so the same versions and the same sums: S > 0 made reproducible
if [ -f "$T/h2.bin" ] && run h2again --dp-mode ps --staleness 2 --straggler hold:1 --save "$T/h2again.bin"; then
    if cmp -s "$T/h2.bin" "$T/h2again.bin"; then
        pass "--staleness 2, rank 1 held, run twice: the same checkpoint byte for byte (every gradient computed on the same version)"
    else
        fail "--staleness 2, rank 1 held, run twice: the checkpoints differ" "$(cmp "$T/h2.bin" "$T/h2again.bin" | head -1)"
    fi
fi
if run hasync --dp-mode ps --ps-async --straggler hold:1 --ps-log "$T/hasync.plog"; then
    # the log's workers column: 3 x STEPS updates of the others, then rank 1's STEPS, its first 3 x STEPS stale
    got=$(grep -v '^#' "$T/hasync.plog" | awk -v T="$STEPS" '
        {n++; if (n <= 3 * T && $6 == 1) bad = bad " update " n " is rank 1s"
         if (n > 3 * T && ($6 != 1 || $7 != n - 3 * T - 1 || $8 != (n == 3 * T + 1 ? 3 * T : 0))) bad = bad " update " n ": " $6 " " $7 " " $8}
        END {if (n != 4 * T) bad = bad " " n " updates"; print bad}')
    if [ -z "$got" ] && [ "$(ahead hasync)" = "$STEPS" ] && [ "$(waits hasync)" = "0 0 0 0" ]; then
        pass "--ps-async, rank 1 held: it does not set the pace: the others did all $((3 * STEPS)) steps first (the first $((3 * STEPS)) updates), $STEPS steps ahead of it, never held back; its first gradient $((3 * STEPS)) updates stale"
    else
        fail "--ps-async, rank 1 held: the log or the counts are not what no bound gives" "log:$got" "ahead '$(ahead hasync)' (want $STEPS), held back '$(waits hasync)'"
    fi
fi

# --- 3. the bound with a sleeping straggler: whatever the timing, never more than S stale
if run r1 --dp-mode ps --staleness 1 --straggler random:20 --ps-log "$T/r1.plog"; then
    got=$(grep -v '^#' "$T/r1.plog" | awk '{n = split($8, s, ","); for (i = 1; i <= n; i++) {c++; if (s[i] > m) m = s[i]}} END {print c + 0, m + 0}')
    read -r count worst <<<"$got"
    if [ "$count" -eq $((4 * STEPS)) ] && [ "$worst" -le 1 ] && [ "$(ahead r1)" -le 1 ]; then
        pass "--staleness 1, random:20 straggler: all $count applied gradients at most 1 stale (max $worst), no worker more than 1 step ahead ($(staleness r1))"
    else
        fail "--staleness 1, random:20 straggler: $count gradients, max staleness $worst, ahead $(ahead r1) (want $((4 * STEPS)), <= 1, <= 1)"
    fi
fi

# --- 4. bad input and runtime checks: every rank's message, non-zero exit, no hang
expect_all "a straggler rank that does not exist" "--straggler 7:50: there are only 4 ranks" 4 $TRAIN --straggler 7:50
expect_all "a held rank that does not exist" "--straggler hold:7: there are only 4 ranks" 4 $TRAIN --dp-mode ps --staleness 1 --straggler hold:7
expect_all "a held straggler without the asynchronous server" "holds a rank back at the asynchronous server" 2 $TRAIN --dp-mode ps --straggler hold:1
expect_all "a negative staleness" "--staleness must be >= 0 steps" 2 $TRAIN --dp-mode ps --staleness -1
expect_all "--ps-async with two servers" "runs one server" 2 $TRAIN --dp-mode ps --ps-async --ps-servers 2
expect_all "--ps-log without the asynchronous server" "--ps-log is the asynchronous server's log" 2 $TRAIN --dp-mode ps --ps-log "$T/x.plog"
expect_all "--ps-log into a missing directory" "--ps-log '$T/nowhere/x.plog': the directory" 2 $TRAIN --dp-mode ps --ps-async --ps-log "$T/nowhere/x.plog"
expect_all "a diverged update on the server" "gradient norm nan: training diverged" 4 $TRAIN --dp-mode ps --staleness 1 --fault nan:3

# --- 5. the perturbations: the pushes summed 1, 2, ..., N-1 (not the synchronous server's N-1, ..., 1)
if perturbed_build "sum order"; then   # (test/perturbations.py)
    # shellcheck disable=SC2086
    $MPIRUN -np 4 "$T/perturbed/train" $D $MODEL $QUIET --dp-mode ps --staleness 0 --ps-log "$T/p.plog" --save "$T/p.bin" >"$T/p.out" 2>&1
    if ! cmp -s "$T/sync.bin" "$T/p.bin"; then
        pass "perturbation 'sum order' breaks the S = 0 equality: $(cmp "$T/sync.bin" "$T/p.bin" | sed 's/.*differ: //') of the checkpoint \
(the per-step loss/norm $(same_steps "$T/sync.log" "$T/p.plog" >/dev/null && echo "still agree at %.9g" || echo "differ too"))"
    else
        fail "perturbation 'sum order' went unnoticed"
    fi
fi
# the staleness wait skipped (a worker asks for any version): with rank 1 held, the others never
# wait, run ahead of it, and push clock S + 1 while the server is still at clock 0: the server's
# check stops the run, every time
if perturbed_build "no staleness wait"; then   # (test/perturbations.py)
    # shellcheck disable=SC2086
    $MPIRUN -np 4 "$T/perturbed/train" $D $MODEL $QUIET --dp-mode ps --staleness 1 --straggler hold:1 --ps-log "$T/w.plog" >"$T/w.out" 2>&1
    if grep -q "pushed clock 2 while the server is at clock 0 (the bound is broken)" "$T/w.out"; then
        pass "perturbation 'no staleness wait' is caught: $(grep -m1 -o 'rank [0-9]* pushed clock .*' "$T/w.out")"
    else
        fail "perturbation 'no staleness wait' went unnoticed" "$(grep -E 'staleness  |error' "$T/w.out" | head -3)"
    fi
fi
exit 0
