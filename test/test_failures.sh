#!/usr/bin/env bash
# Failures during a run (llmc/train/guard.h, llmc/train/fault_injection.h, doc/errors.md "Failures"), on a small model:
#   - NaN, --on-nan stop: a NaN loss scale injected at step 2 (--fault nan:2) stops the run on 1
#     rank, on 2 ranks and on 2 ranks with ZeRO-1, every error line naming step 2 and the first
#     tensor (wte), non-zero exit, no --log file or .tmp left;
#   - NaN, --on-nan skip: the run finishes all its steps; the --log lines before the NaN step equal
#     a run without the fault, the NaN step's loss and norm are nan, the steps after it train on;
#     and the weights are those of the step before: a 3-step run whose step 3 is skipped saves the
#     same bytes as a 2-step run (the warmup makes the first steps' learning rates independent of
#     --steps); on 1 rank and on 2 ranks with ZeRO-1;
#   - a rank killed with SIGKILL mid-run (from outside, and with --fault kill:2:3) ends the 4-rank
#     job with a non-zero exit within 60 s, no trainer process left;
#   - a rank that hangs (--fault hang:RANK:STEP, between steps; --fault stall:RANK:STEP, inside a
#     step: dp 2, dp 4 with ZeRO-1, tp 2) with --comm-timeout 5 ends the job within 60 s
#     on 2 and 4 ranks with one line, from one rank, naming the hung rank; a rank frozen whole
#     (SIGSTOP: its heartbeats stop too) is named as well, on 2 ranks and on 4 with ZeRO-3, where
#     the whole output holds one verdict (from rank 0): not a word from the stopped rank when
#     mpirun continues it to end it, nor from the others; a run with --comm-timeout and no fault
#     is the run without it (same --log bytes);
#   - a save into a full disk (ulimit -f: the file-size limit) fails with "writing '...' failed:
#     File too large", leaves no .tmp and no file, and keeps a previous file as it was.
# TRAINER=PATH/train_gpt2cpu runs another build of the trainer (a perturbed one, to see the test fail).
set -u
cd "$(dirname "$0")/.."
T=build/failures-test
rm -rf "$T"
mkdir -p "$T"
WHAT="the failure tests"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
TRAIN="${TRAINER:-./train_gpt2cpu} --train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin
  --layers 2 --heads 2 --channels 32 --max-seq 32 --batch 4 --seq 16 --eval-every 0 --accuracy 0 --sample-every 0 --threads 1"
TRAIN=$(echo $TRAIN)   # one line
MPI="timeout 90 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1 --tag-output"

# no_leftovers NAME...: none of these files, nor their .tmp, exist
no_leftovers() { local f; for f in "$@"; do [ -e "$f" ] || [ -e "$f.tmp" ] && return 1; done; return 0; }
# trainers_left PATTERN: trainer processes whose command line holds PATTERN (the run's unique --log)
trainers_left() { pgrep -f "^[^ ]*train_gpt2cpu .*$1" | tr '\n' ' '; }
# error lines of a --tag-output run
errors() { grep -o '<stderr>:error: .*' "$1" | sed 's/^<stderr>://'; }

# ---- NaN, --on-nan stop: step 2 named, the first tensor named, nothing left
$TRAIN --steps 4 --fault nan:2 --log "$T/stop1.log" >"$T/stop1.out" 2>"$T/stop1.err"
rc=$?
if [ $rc -eq 1 ] && grep -q "^error: step 2: loss nan, gradient norm nan: training diverged; first non-finite gradient: wte " "$T/stop1.err" &&
   [ "$(wc -l <"$T/stop1.err")" -eq 1 ] && no_leftovers "$T/stop1.log"; then
    pass "NaN at step 2, 1 rank: $(cat "$T/stop1.err")"
else
    fail "NaN stop, 1 rank" "exit $rc (want 1)" "$(head -2 "$T/stop1.err")" "$(ls "$T" | grep stop1)"
fi
for mode in "" "--zero 1"; do
    name="stop2${mode// /}"
    # shellcheck disable=SC2086
    $MPI -np 2 $TRAIN --steps 4 $mode --fault nan:2 --log "$T/$name.log" >"$T/$name.out" 2>&1
    rc=$?
    n=$(errors "$T/$name.out" | wc -l)
    good=$(errors "$T/$name.out" | grep -c "^error: \[rank [01]\] step 2: .*training diverged; first non-finite gradient: wte ")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -ge 1 ] && [ "$good" -eq "$n" ] && no_leftovers "$T/$name.log"; then
        pass "NaN at step 2, 2 ranks${mode:+ $mode}: exit $rc, $n rank(s) said: $(errors "$T/$name.out" | head -1 | cut -c1-110)"
    else
        fail "NaN stop, 2 ranks${mode:+ $mode}" "exit $rc, $n error lines, $good naming step 2 and wte" "$(grep stderr "$T/$name.out" | head -3)"
    fi
done

# ---- NaN, --on-nan skip: the steps before are the run's without the fault, the weights unchanged
# skip_check LABEL NP FLAGS...: 1 rank (NP 0) or NP ranks
skip_check() {
    local label=$1 np=$2 run=()
    shift 2
    [ "$np" -gt 0 ] && run=($MPI -np "$np")
    rm -f "$T"/sk_*
    # shellcheck disable=SC2086
    "${run[@]}" $TRAIN "$@" --warmup 10 --steps 2 --log "$T/sk_clean.log" --save "$T/sk_clean.bin" >"$T/sk_clean.out" 2>&1
    # shellcheck disable=SC2086
    "${run[@]}" $TRAIN "$@" --warmup 10 --steps 3 --fault nan:3 --on-nan skip --log "$T/sk_3.log" --save "$T/sk_3.bin" >"$T/sk_3.out" 2>&1
    local rc3=$?
    # shellcheck disable=SC2086
    "${run[@]}" $TRAIN "$@" --warmup 10 --steps 5 --fault nan:3 --on-nan skip --log "$T/sk_5.log" >"$T/sk_5.out" 2>&1
    local rc5=$? bad=""
    [ $rc3 -eq 0 ] && [ $rc5 -eq 0 ] || bad="exit $rc3 / $rc5 (want 0)"
    [ "$(head -2 "$T/sk_3.log" 2>/dev/null)" = "$(cat "$T/sk_clean.log")" ] || bad="$bad; steps 1-2 differ from the run without the fault"
    [ "$(head -2 "$T/sk_5.log" 2>/dev/null)" = "$(cat "$T/sk_clean.log")" ] || bad="$bad; steps 1-2 of the 5-step run differ"
    sed -n 3p "$T/sk_3.log" | grep -q "^3 nan nan " || bad="$bad; step 3's --log line is not '3 nan nan lr'"
    [ "$(awk '$1 > 3 && $2 + 0 == $2 && $2 > 0' "$T/sk_5.log" 2>/dev/null | wc -l)" -eq 2 ] || bad="$bad; steps 4-5 do not train on (finite losses)"
    cmp -s "$T/sk_clean.bin" "$T/sk_3.bin" || bad="$bad; the weights after the skipped step 3 differ from those after step 2"
    grep -q "step 3: loss nan, gradient norm nan: update skipped (--on-nan skip); first non-finite gradient: wte" "$T/sk_3.out" ||
        bad="$bad; no skip message"
    grep -q "step    3/3 | loss nan" "$T/sk_3.out" || bad="$bad; no step line for step 3"
    if [ -z "$bad" ]; then
        pass "NaN at step 3 skipped, $label: steps 1-2 as without the fault, step 3 logged as nan, steps 4-5 train on, weights after step 3 = after step 2 (same bytes)"
    else
        fail "NaN skip, $label:$bad" "$(tail -2 "$T/sk_3.out")" "$(cat "$T/sk_3.log" 2>/dev/null | head -3)"
    fi
}
skip_check "1 rank" 0
skip_check "2 ranks with ZeRO-1" 2 --zero 1

# ---- a rank killed with SIGKILL: from outside, mid-run, and at a step (--fault kill)
# ended LABEL RC SECONDS PATTERN OUT: non-zero, under 60 s, no trainer left. (Not: no .tmp. The
# surviving ranks usually get mpirun's SIGTERM and remove theirs, but now and then (1 run in 10
# here) MPI ends rank 0 without a signal it can catch, and its .tmp stays: never taken for a
# finished file, and replaced by the next write.)
ended() {
    local label=$1 rc=$2 secs=$3 pattern=$4 out=$5 left
    sleep 1
    left=$(trainers_left "$pattern")
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$secs" -lt 60 ] && [ -z "$left" ]; then
        pass "$label: the job ended in $secs s, exit $rc, no trainer process left"
        return 0
    fi
    fail "$label" "exit $rc after $secs s (want non-zero, < 60 s); processes left: '${left}'" "$(grep -v stdout "$out" | tail -3)"
    [ -n "$left" ] && kill -9 $left 2>/dev/null
    return 1
}
# rank_pid NAME RANK: once the run writing $T/NAME.out has printed a step, the pid of its rank
# RANK (the trainer process whose --log is $T/NAME.log and whose environment says that rank);
# empty after 20 s without one
rank_pid() {
    local name=$1 rank=$2 pid
    for _ in $(seq 1 100); do
        if grep -q "<stdout>:step   " "$T/$name.out"; then
            for pid in $(pgrep -f "^[^ ]*train_gpt2cpu .*$T/$name.log"); do
                if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then echo "$pid"; return; fi
            done
        fi
        sleep 0.2
    done
}
start=$SECONDS
$MPI -np 4 $TRAIN --steps 100000 --log "$T/kill.log" >"$T/kill.out" 2>&1 &
job=$!
victim=$(rank_pid kill 2)
if [ -n "$victim" ]; then
    t0=$SECONDS
    kill -KILL "$victim"
    wait $job
    ended "SIGKILL to rank 2 of 4 mid-run" $? $((SECONDS - t0)) kill.log "$T/kill.out"
else
    kill $job 2>/dev/null; wait $job
    fail "SIGKILL test: no rank 2 process found after $((SECONDS - start)) s" "$(tail -3 "$T/kill.out")"
fi
t0=$SECONDS
$MPI -np 4 $TRAIN --steps 100000 --fault kill:2:3 --log "$T/fkill.log" >"$T/fkill.out" 2>&1
ended "--fault kill:2:3 on 4 ranks" $? $((SECONDS - t0)) fkill.log "$T/fkill.out"

# ---- a rank that hangs, --comm-timeout 5: the job ends, naming the rank
# stuck_check FAULT NP RANK STEP WANT FLAGS...: rank RANK of NP gets --fault FAULT:RANK:STEP and
# --comm-timeout 5; the job must end within 60 s with one error line (one rank speaks), naming rank RANK as WANT says
stuck_check() {
    local fault=$1 np=$2 r=$3 s=$4 want=$5 t0=$SECONDS rc named all name
    shift 5
    name="$fault$np$(echo "$*" | tr -dc 'a-z0-9')"
    $MPI -np "$np" $TRAIN --steps 100000 --comm-timeout 5 --fault "$fault:$r:$s" "$@" --log "$T/$name.log" >"$T/$name.out" 2>&1
    rc=$?
    named=$(errors "$T/$name.out" | grep -c "no progress for [0-9]* s (--comm-timeout 5): rank $r stopped answering ($want")
    all=$(errors "$T/$name.out" | wc -l)
    if ended "rank $r of $np: --fault $fault at step $s${*:+ ($*)}, --comm-timeout 5" $rc $((SECONDS - t0)) "$name.log" "$T/$name.out" >"$T/$name.ended" &&
       [ "$named" -eq 1 ] && [ "$all" -eq 1 ]; then
        pass "$(sed 's/^PASS //' "$T/$name.ended"); one verdict: $(errors "$T/$name.out" | head -1 | cut -c1-190)"
    else
        grep -v '^PASS' "$T/$name.ended"
        fail "rank $r of $np, --fault $fault ($*): $named of $all error lines name rank $r (want 1 of 1)" "$(errors "$T/$name.out" | head -2)"
    fi
}
# a rank that hangs between steps: the others are a step further on
stuck_check hang 2 1 3 "last seen at the end of step 2;"
stuck_check hang 4 2 4 "last seen at the end of step 3;"
# a rank that stalls INSIDE a step (its main thread stops at the backward of the last block): the
# others go on through the passes to a collective of the same step; the watchdogs compare the
# model's hook events and name the rank that stopped where the others went on
stuck_check stall 2 1 3 "last seen in step 3 at the backward's start (micro-batch 1); the others went on to "
stuck_check stall 4 2 3 "last seen in step 3 at the backward's start (micro-batch 1); the others went on to " --zero 1
stuck_check stall 2 0 2 "last seen in step 2 at the backward's start (micro-batch 1); the others went on to " --tp 2

# freeze NAME NP RANK ARGS...: the trainer on NP ranks with ARGS (--log $T/NAME.log, output
# $T/NAME.out); once it has printed a step and a second of heartbeats has gone by, its rank RANK
# is stopped whole with SIGSTOP (never continued by the test) and the job waited for. Sets rc, the
# job's exit status, secs, the seconds from the stop to its end, and victim, the stopped process
# (the caller kills it after its checks); returns 1 after a FAIL line when that rank was not found.
freeze() {
    local name=$1 np=$2 rank=$3 job t0
    shift 3
    $MPI -np "$np" $TRAIN "$@" --log "$T/$name.log" >"$T/$name.out" 2>&1 &
    job=$!
    victim=$(rank_pid "$name" "$rank")
    if [ -z "$victim" ]; then
        kill $job 2>/dev/null; wait $job
        fail "SIGSTOP test, $np ranks: no rank $rank process found" "$(tail -3 "$T/$name.out")"
        return 1
    fi
    sleep 1   # a few heartbeats from the running ranks first
    t0=$SECONDS
    kill -STOP "$victim"
    wait $job
    rc=$?
    secs=$((SECONDS - t0))
}

# a rank frozen whole (SIGSTOP): its heartbeats stop as well
if freeze stop 2 1 --steps 100000 --comm-timeout 5; then
    if ended "rank 1 of 2 frozen (SIGSTOP), --comm-timeout 5" $rc $secs stop.log "$T/stop.out" >"$T/stop.ended" &&
       [ "$(errors "$T/stop.out" | wc -l)" -eq 1 ] && errors "$T/stop.out" | grep -q "rank 1 stopped answering (no heartbeat for [0-9]* s: the process is frozen or gone"; then
        pass "$(sed 's/^PASS //' "$T/stop.ended"): $(errors "$T/stop.out" | head -1 | cut -c1-150)"
    else
        grep -v '^PASS' "$T/stop.ended"
        fail "rank 1 frozen: not named" "$(grep -v stdout "$T/stop.out" | head -3)"
    fi
    kill -9 "$victim" 2>/dev/null
fi

# 4 ranks with ZeRO-3, rank 2 frozen whole (SIGSTOP): the job ends with one verdict, printed once,
# by rank 0 (the lowest rank it does not name), naming rank 2. The test never continues rank 2;
# mpirun does, just before its SIGTERM: rank 2, which knows it was stopped, accuses no one, and
# ranks 1 and 3, which reach the same verdict as rank 0, leave it to rank 0. --comm-timeout 3: the
# others call a rank frozen after 3 s without heartbeats (llmc/train/watchdog.h).
if freeze stop4 4 2 --steps 100000 --zero 3 --comm-timeout 3; then
    verdicts=$(grep -c "stopped answering\|cannot be told" "$T/stop4.out")
    if ended "rank 2 of 4 frozen (SIGSTOP), --zero 3 --comm-timeout 3" $rc $secs stop4.log "$T/stop4.out" >"$T/stop4.ended" &&
       [ "$(errors "$T/stop4.out" | wc -l)" -eq 1 ] && [ "$verdicts" -eq 1 ] && errors "$T/stop4.out" |
       grep -q "^error: \[rank 0\] no progress for [0-9]* s (--comm-timeout 3): rank 2 stopped answering (no heartbeat for [0-9]* s: the process is frozen or gone"; then
        pass "$(sed 's/^PASS //' "$T/stop4.ended"); one verdict: $(errors "$T/stop4.out" | cut -c1-150)"
    else
        grep -v '^PASS' "$T/stop4.ended"
        fail "rank 2 of 4 frozen: want one line, from rank 0, naming rank 2; $verdicts verdict line(s)" "$(grep -v stdout "$T/stop4.out" | grep -v -- '---' | head -6)"
    fi
    kill -9 "$victim" 2>/dev/null
fi

# --comm-timeout changes nothing when nothing hangs
$MPI -np 2 $TRAIN --steps 10 --comm-timeout 5 --log "$T/ct.log" >"$T/ct.out" 2>&1
rc1=$?
$MPI -np 2 $TRAIN --steps 10 --log "$T/noct.log" >"$T/noct.out" 2>&1
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$T/ct.log" "$T/noct.log" && [ "$(wc -l <"$T/ct.log")" -eq 10 ]; then
    pass "--comm-timeout 5 on a run that does not hang: exit 0, the same 10 --log lines as without it"
else
    fail "--comm-timeout on a healthy run" "exit $rc1 / $rc2" "$(grep stderr "$T/ct.out" | head -2)"
fi

# ---- a save into a full disk: the file-size limit (ulimit -f, in KiB) set on the trainer alone
# (MPI's own shared-memory files are bigger: mpirun and one rank without the shared-memory
# transport), and --save bigger than it
full() {
    # shellcheck disable=SC2086
    timeout 60 mpirun -np 1 --mca btl self bash -c "ulimit -f 64; exec $TRAIN --steps 2 --save $T/full.bin --log $T/full.log" \
        >"$T/full.out" 2>&1
}
full
rc=$?
if [ $rc -ne 0 ] && grep -q "^error: writing '$T/full.bin.tmp' failed: File too large" "$T/full.out" && no_leftovers "$T/full.bin"; then
    pass "save into a full disk: exit $rc, '$(grep -m1 '^error: ' "$T/full.out")', no file and no .tmp left"
else
    fail "save into a full disk" "exit $rc" "$(grep -v -- '---' "$T/full.out" | head -3)" "$(ls "$T" | grep full)"
fi
echo "the previous model" >"$T/full.bin"
full
rc=$?
if [ $rc -ne 0 ] && grep -q "File too large" "$T/full.out" && [ "$(cat "$T/full.bin")" = "the previous model" ] && [ ! -e "$T/full.bin.tmp" ]; then
    pass "save into a full disk over a previous file: exit $rc, the previous file kept as it was, no .tmp"
else
    fail "save into a full disk over a previous file" "exit $rc" "$(grep -v -- '---' "$T/full.out" | head -3)"
fi
exit 0
