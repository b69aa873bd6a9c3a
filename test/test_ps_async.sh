#!/usr/bin/env bash
# The asynchronous / stale synchronous parameter server (llmc/parallel/dp_ps_async.h) and the
# straggler injector (llmc/guard.h), on 4 CPU ranks in fp32:
#   - --staleness 0 is the synchronous parameter server (--dp-mode ps --ps-servers 1) bit for bit:
#     the same --save checkpoint (cmp) and, per step, the same mean loss and gradient norm
#     (the sync run's --log against the server's --ps-log), memory table and bytes = formula;
#   - the staleness bound: every applied gradient's staleness <= S (from --ps-log), S = 1, 2,
#     with a random straggler, and the bound is reached (some gradient is S stale);
#   - wall time with a straggler of 3x the step time (measured first): random:MS, async and S = 1
#     finish faster than S = 0 and the synchronous server; RANK:MS (persistent), the straggler
#     sets the pace of SSP (every worker's step rate alike) but not of async (the others run
#     faster than it);
#   - bad input and runtime checks: a clear message, non-zero exit, no hang;
#   - a perturbation (the pushes summed in another order) that must break the S = 0 equality.
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
MODEL="--layers 3 --heads 2 --channels 64 --batch 24 --seq 32 --steps 20 --lr 1e-3 --warmup 5"
QUIET="--eval-every 0 --accuracy 0 --sample-every 0 --threads 1"
TRAIN="./train_gpt2cpu $D $MODEL $QUIET"

# run NAME FLAGS...: 4 ranks into $T/NAME.out (.log, .bin, .plog with --ps-log), wall seconds in $T/NAME.wall
run() {
    local name=$1 s e; shift
    s=$(date +%s.%N)
    # shellcheck disable=SC2086
    $MPIRUN -np 4 $TRAIN "$@" >"$T/$name.out" 2>&1 || { fail "$name: the run failed" "$(grep -v '^\s*$' "$T/$name.out" | tail -3)"; return 1; }
    e=$(date +%s.%N)
    echo "$s $e" | awk '{printf "%.3f", $2 - $1}' >"$T/$name.wall"
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
if [ "$checks" -eq 3 ] && [ "$steps" -eq 20 ]; then
    pass "--staleness 0: memory table = formula on every rank; bytes = formula (rank 0 each step, the server and each worker in all)"
else
    fail "--staleness 0: memory/bytes checks ($checks of 3, $steps of 20 steps)" "$(grep -E 'memory check|server     sent|workers    sent' "$T/s0.out")"
fi

# --- 2. the step time, then a straggler of 3x it
STEP_MS=$(sed -n 's/^  worker 0 .*(\([0-9.]*\) ms a step.*/\1/p' "$T/s0.out")
MS=$(awk -v t="$STEP_MS" 'BEGIN {printf "%d", 3 * t + 0.5}')
[ "$MS" -ge 15 ] || MS=15
echo "     (step time on 4 ranks: $STEP_MS ms; the straggler sleeps MS = $MS ms)"

# --- 3. the staleness bound, S = 1 and 2, with a random straggler
for S in 1 2; do
    run "s$S" --dp-mode ps --staleness "$S" --straggler "random:$MS" --steps 30 --ps-log "$T/s$S.plog" || continue
    got=$(grep -v '^#' "$T/s$S.plog" | awk '{n = split($8, s, ","); for (i = 1; i <= n; i++) {c++; if (s[i] > m) m = s[i]}} END {print c + 0, m + 0}')
    read -r count worst <<<"$got"
    if [ "$count" -eq 120 ] && [ "$worst" -eq "$S" ]; then
        pass "--staleness $S: all 120 applied gradients are at most $S stale (--ps-log), and the bound is reached (max $worst)"
    else
        fail "--staleness $S: $count gradients, max staleness $worst (want 120, max $S)" "$(grep 'staleness  ' "$T/s$S.out")"
    fi
done

# --- 4. wall time with the straggler: random (one rank per step) and persistent (rank 1)
trained() { grep -v '^#' "$T/$1.plog" | tail -1 | awk '{print $2}'; }   # seconds to the last update (the server's clock)
run rs0 --dp-mode ps --staleness 0 --straggler "random:$MS" --steps 30 --ps-log "$T/rs0.plog"
run rasync --dp-mode ps --ps-async --straggler "random:$MS" --steps 30 --ps-log "$T/rasync.plog"
run rsync --dp-mode ps --straggler "random:$MS" --steps 30
t0=$(trained rs0); t1=$(trained s1); ta=$(trained rasync)
echo "     random:$MS, 30 steps: to the last update S=0 $t0 s, S=1 $t1 s, async $ta s; whole runs: synchronous server $(cat "$T/rsync.wall") s," \
     "S=0 $(cat "$T/rs0.wall") s, S=1 $(cat "$T/s1.wall") s, async $(cat "$T/rasync.wall") s"
for x in "S = 1|$t1|s1" "async|$ta|rasync"; do
    IFS='|' read -r name t tag <<<"$x"
    if awk -v a="$t" -v b="$t0" -v c="$(cat "$T/$tag.wall")" -v d="$(cat "$T/rsync.wall")" 'BEGIN {exit !(a < 0.8 * b && c < d)}'; then
        pass "random:$MS straggler: $name trains in $t s, under 0.8 x the $t0 s of S = 0; its whole run is shorter than the synchronous server's"
    else
        fail "random:$MS straggler: $name is not faster ($t s against $t0 s for S = 0; whole run $(cat "$T/$tag.wall") s against $(cat "$T/rsync.wall") s)"
    fi
done
run ps1 --dp-mode ps --staleness 1 --straggler "1:$MS" --steps 30 --ps-log "$T/ps1.plog"
run pasync --dp-mode ps --ps-async --straggler "1:$MS" --steps 30 --ps-log "$T/pasync.plog"
rate() { awk -v w="$2" '$1 == "worker" && $2 == w {print $5}' "$T/$1.out"; }
echo "     1:$MS (persistent), 30 steps: to the last update S=1 $(trained ps1) s, async $(trained pasync) s;" \
     "steps/s of worker 0 / worker 1 (the straggler): S=1 $(rate ps1 0) / $(rate ps1 1), async $(rate pasync 0) / $(rate pasync 1)"
if awk -v a="$(rate ps1 0)" -v b="$(rate ps1 1)" -v c="$(rate pasync 0)" -v d="$(rate pasync 1)" 'BEGIN {exit !(a < 1.25 * b && c > 2 * d)}'; then
    pass "persistent straggler: it sets the pace of S = 1 (worker 0 within 1.25x of its step rate), not of async (worker 0 over 2x faster)"
else
    fail "persistent straggler: step rates S=1 $(rate ps1 0) / $(rate ps1 1), async $(rate pasync 0) / $(rate pasync 1)"
fi

# --- 5. bad input and runtime checks: every rank's message, non-zero exit, no hang
expect_all "a straggler rank that does not exist" "--straggler 7:50: there are only 4 ranks" 4 $TRAIN --straggler 7:50
expect_all "a negative staleness" "--staleness must be >= 0 steps" 2 $TRAIN --dp-mode ps --staleness -1
expect_all "--ps-async with two servers" "runs one server" 2 $TRAIN --dp-mode ps --ps-async --ps-servers 2
expect_all "--ps-log without the asynchronous server" "--ps-log is the asynchronous server's log" 2 $TRAIN --dp-mode ps --ps-log "$T/x.plog"
expect_all "--ps-log into a missing directory" "--ps-log '$T/nowhere/x.plog': the directory" 2 $TRAIN --dp-mode ps --ps-async --ps-log "$T/nowhere/x.plog"
expect_all "a diverged update on the server" "gradient norm nan: training diverged" 4 $TRAIN --dp-mode ps --staleness 1 --fault nan:3

# --- 6. the perturbation: the pushes summed 1, 2, ..., N-1 (not the synchronous server's N-1, ..., 1)
if perturbed_build "sum order" llmc/parallel/dp_ps_async.h "for (int w = N - 1; w >= 1; w--) {" "for (int w = 1; w < N; w++) {"; then
    # shellcheck disable=SC2086
    $MPIRUN -np 4 "$T/perturbed/train" $D $MODEL $QUIET --dp-mode ps --staleness 0 --ps-log "$T/p.plog" --save "$T/p.bin" >"$T/p.out" 2>&1
    if ! cmp -s "$T/sync.bin" "$T/p.bin"; then
        pass "perturbation 'sum order' breaks the S = 0 equality: $(cmp "$T/sync.bin" "$T/p.bin" | sed 's/.*differ: //') of the checkpoint \
(the per-step loss/norm $(same_steps "$T/sync.log" "$T/p.plog" >/dev/null && echo "still agree at %.9g" || echo "differ too"))"
    else
        fail "perturbation 'sum order' went unnoticed"
    fi
fi
# the staleness wait skipped (a worker asks for any version): with a persistent straggler the
# others run ahead of it, and the server's check (or the log) shows the bound broken
if perturbed_build "no staleness wait" llmc/parallel/dp_ps_async.h "int want = a->async ? 0 : a->clock + 1 - a->S;" "int want = 0;"; then
    # shellcheck disable=SC2086
    $MPIRUN -np 4 "$T/perturbed/train" $D $MODEL $QUIET --steps 30 --dp-mode ps --staleness 1 --straggler "1:$MS" --ps-log "$T/w.plog" >"$T/w.out" 2>&1
    worst=$(grep -sv '^#' "$T/w.plog" | awk '{n = split($8, s, ","); for (i = 1; i <= n; i++) if (s[i] > m) m = s[i]} END {print m + 0}')
    if grep -q "the bound is broken" "$T/w.out" || [ "$worst" -gt 1 ]; then
        pass "perturbation 'no staleness wait' is caught: $(grep -m1 -o 'rank [0-9]* pushed clock .*' "$T/w.out" || echo "max staleness $worst > 1")"
    else
        fail "perturbation 'no staleness wait' went unnoticed (max staleness $worst)"
    fi
fi
exit 0
