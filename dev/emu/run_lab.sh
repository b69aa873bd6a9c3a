#!/usr/bin/env bash
# The kernel lab (dev/cuda) under the CPU emulator: every lab binary in every warp order.
#
#   dev/emu/run_lab.sh DIR NAME...      (make emu-lab: DIR = build/emu/dev/cuda, every program)
#
# Runs DIR/NAME --small with CUDAEMU_ORDER = forward, reverse and random (the order in which the
# emulator schedules CUDA threads: a missing __syncthreads or a shuffle in divergent code shows
# up in some order), prints each version's PASS/FAIL line with the order after the verdict
#   PASS [reverse] layernorm_forward v2 (out, mean, rstd vs llmc/cpu)
# (lines start with "PASS " or "FAIL ", as test/run_tests.sh counts them), a FAIL line for a
# program that crashed or stopped early (emulator deadlock report, die(), a signal, a time-out),
# then the time each program took per order and a summary. Exit status 1 when anything failed.
#
# Environment: CUDAEMU_SEED (random order; default 1234, the emulator's), LAB_TIMEOUT (seconds
# per run, default 300), LAB_LOG_DIR (full outputs; default DIR/logs), LAB_ORDERS (default
# "forward reverse random").
set -u

if [ $# -lt 2 ]; then
    echo "usage: $0 DIR NAME...   (runs DIR/NAME --small in every CUDAEMU_ORDER)" >&2
    exit 2
fi
dir=$1
shift
orders=${LAB_ORDERS:-forward reverse random}
seed=${CUDAEMU_SEED:-1234}
limit=${LAB_TIMEOUT:-300}
logs=${LAB_LOG_DIR:-$dir/logs}
mkdir -p "$logs" || exit 2
have_timeout=0
command -v timeout >/dev/null 2>&1 && have_timeout=1

now() { date +%s.%N; }
npass=0
nfail=0
failed_runs=""
times=""
t_all=$(now)
echo "kernel lab under the CPU emulator: $# program(s) x orders: $orders (random seed $seed); logs in $logs"
for name in "$@"; do
    bin=$dir/$name
    row=$(printf "%-20s" "$name")
    for order in $orders; do
        log=$logs/$name.$order.log
        if [ ! -x "$bin" ]; then
            echo "FAIL [$order] $name (no binary $bin: build it with make $bin)"
            nfail=$((nfail + 1))
            failed_runs="$failed_runs $name[$order]"
            row="$row $(printf "%8s" "-")"
            continue
        fi
        t0=$(now)
        if [ $have_timeout = 1 ]; then
            CUDAEMU_ORDER=$order CUDAEMU_SEED=$seed timeout "$limit" "$bin" --small >"$log" 2>&1
        else
            CUDAEMU_ORDER=$order CUDAEMU_SEED=$seed "$bin" --small >"$log" 2>&1
        fi
        rc=$?
        t1=$(now)
        row="$row $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%7.2fs", b - a }')"
        # the verdicts, with the order after PASS/FAIL
        sed -n -E "s/^(PASS|FAIL) /\\1 [$order] /p" "$log"
        p=$(grep -c '^PASS ' "$log")
        f=$(grep -c '^FAIL ' "$log")
        npass=$((npass + p))
        nfail=$((nfail + f))
        bad=$f
        # a run that did not end normally: a crash, a deadlock report, die(), a time-out, or a
        # non-zero exit without the lab's own "FAILED validation" line; or no verdict at all
        why=""
        if [ $rc -ne 0 ] && ! grep -q 'version(s) FAILED validation$' "$log"; then
            if [ $rc -eq 124 ] && [ $have_timeout = 1 ]; then why="timed out after ${limit}s";
            elif [ $rc -gt 128 ]; then why="killed by signal $((rc - 128))";
            else why="exit status $rc"; fi
        elif [ $rc -eq 0 ] && [ "$p" -eq 0 ]; then
            why="no PASS line"
        elif [ $rc -eq 0 ] && [ "$f" -gt 0 ]; then
            why="FAIL lines but exit status 0"
        fi
        if [ -n "$why" ]; then
            # the version that was running (each prints "version K" first), else the program
            what=$name
            k=$(sed -n -E 's/^version ([0-9]+)$/\1/p' "$log" | tail -n 1)
            [ -n "$k" ] && what="$name v$k"
            last=$(grep -v '^ *$' "$log" | tail -n 1 | cut -c1-200)
            echo "FAIL [$order] $what (did not finish: $why; last output: $last)"
            nfail=$((nfail + 1))
            bad=$((bad + 1))
        fi
        if [ $bad -gt 0 ]; then
            failed_runs="$failed_runs $name[$order]"
            echo "    full output: $log"
        fi
    done
    times="$times$row"$'\n'
done
t_end=$(now)

echo
echo "time per program (host seconds, per order: $orders)"
printf "%s" "$times"
total=$(awk -v a="$t_all" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }')
if [ $nfail -eq 0 ]; then
    echo "emu-lab: all $npass version checks passed ($# programs x orders: $orders; ${total}s)"
    exit 0
fi
echo "emu-lab: $nfail failed, $npass passed ($# programs x orders: $orders; ${total}s); failed runs:$failed_runs"
exit 1
