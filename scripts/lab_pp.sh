#!/usr/bin/env bash
# Lab: pipeline parallelism (llmc/parallel/pp.h, the executor; the schedules: llmc/parallel/pp_1f1b.h,
# pp_interleaved.h, pp_zbh1.h).
#   Part 1: the bubble against the number of micro-batches m, for p = 2 and 4 stages and each
#           schedule (GPipe, 1F1B, interleaved 1F1B with v chunks per stage, ZB-H1): the bubble
#           measured on the stages' clocks (the trainer's "pp bubble | measured", 1 - busy /
#           (p x the step's pipeline time), mean over steps 2..N), the one the simulator gets
#           from the schedule with the measured F, B, W times, the formula (the bubble's share
#           of the step: (p-1)/(m+p-1); (p-1)/(v m+p-1) interleaved; ZB-H1's from f, b, w; the
#           lecture divides the same idle time by the ideal time instead: (p-1)/m, (1/v)(p-1)/m),
#           and the peak number of micro-batches in flight on stage 0 against the schedule's.
#   Part 2: the activation memory of every stage for p = 4, m = 8 (Part 1's runs): one
#           activation slot per micro-batch (and chunk) in flight, so GPipe holds m on every
#           stage and 1F1B p - s on stage s.
#   Part 3: the measured timeline of one step (p = 4, m = 8; Part 1's runs, traced with
#           --trace), drawn by scripts/pp_timeline.py: doc/pipeline-parallel-timeline.png
#           (1F1B), -zb.png (ZB-H1), -interleaved.png, -gpipe.png. TRACE_P=2 draws p = 2's
#           instead (not oversubscribed on 2 cores: the timings there are the schedule's).
# Every run goes through scripts/launch.sh. Tables go to stdout and to $OUT/results.md, every
# run's output and trace to $OUT/.
#
# The model: 8 layers of C 128 (divisible by v x p = 2 x 4 for the interleaved chunks), a step
# of 32 sequences x 64 tokens of random tokens (--bench), split into m micro-batches (the global
# batch stays the same, so a larger m means smaller micro-batches and a smaller bubble). About
# 1 minute on 2 CPU cores (and the trainer's build when it is out of date). The runs with p = 4
# are oversubscribed there (4 ranks take turns on 2 cores): a stage waits for a core as well as
# for its neighbour, so their measured bubbles are noisy and far from the formula; the
# simulated and formula columns, the peaks in flight and the memory are exact. A schedule that
# fails (a run that dies) shows as "not available" with its error, and the lab then exits 1
# after writing everything else.
# Knobs (environment): BIN (default ./train_gpt2cpu), PS ("2 4"), MS ("1 2 4 8"), SCHEDULES
# ("gpipe 1f1b interleaved zb-h1"), CHUNKS (2, interleaved's v), STEPS (8), MODEL, OUT
# (build/lab_pp), DOC (doc: where the timelines go).
#   bash scripts/lab_pp.sh
#   bash scripts/install_deps.sh --lab    # matplotlib, for Part 3's pictures (else skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_gpt2cpu}
PS=${PS:-"2 4"}
MS=${MS:-"1 2 4 8"}
SCHEDULES=${SCHEDULES:-"gpipe 1f1b interleaved zb-h1"}
CHUNKS=${CHUNKS:-2}
STEPS=${STEPS:-8}
MODEL=${MODEL:-"--layers 8 --heads 4 --channels 128 --max-seq 64 --batch 32 --seq 64"}
OUT=${OUT:-build/lab_pp}
DOC=${DOC:-doc}
TRACE_P=${TRACE_P:-4}
TRACE_M=${TRACE_M:-8}
mkdir -p "$OUT" "$DOC"
# the trainer brought up to date (make: nothing to do when it is), or one given as BIN as it is
if [ "$BIN" = ./train_gpt2cpu ] || [ "$BIN" = ./train_gpt2cu ]; then
    make "${BIN#./}" >"$OUT/make.log" 2>&1 || { echo "lab_pp: make ${BIN#./} failed:"; tail -20 "$OUT/make.log"; exit 1; }
fi
[ -x "$BIN" ] || { echo "lab_pp: no trainer $BIN"; exit 1; }
COMMON="--bench --steps $STEPS --eval-every 0 --sample-every 0 --accuracy 0 --threads 1"
REPORT="$OUT/results.md"
start=$(date +%s)
failed=()

# run NAME NP FLAGS...: the trainer through the launcher, its output in $OUT/NAME.out; a run
# that fails is recorded (its last lines shown) and the lab goes on
run() {
    local name=$1 np=$2; shift 2
    # shellcheck disable=SC2086
    if ! scripts/launch.sh --np "$np" -- "$BIN" $MODEL $COMMON "$@" >"$OUT/$name.out" 2>&1; then
        echo "lab_pp: run $name failed ($OUT/$name.out): $(why "$name"); its last lines:" >&2
        # the trainer's last lines, before mpirun's own report (a block between lines of dashes)
        awk '/^-----/ { exit } { print "    " $0 }' "$OUT/$name.out" | tail -5 >&2
        failed+=("$name")
        return 1
    fi
}
# why NAME: the error a failed run died with (one line)
why() { { grep -m1 '^error:' "$OUT/$1.out" || tail -1 "$OUT/$1.out"; } | sed 's/^error: //; s/|/\\|/g'; }
# bubble NAME: the "pp bubble" columns over steps 2..N: measured mean (min..max) | simulated | formula
bubble() {
    grep 'pp bubble | measured' "$OUT/$1.out" | awk 'NR > 1 {
        x = $5; s += x; n++; if (n == 1 || x < lo) lo = x; if (n == 1 || x > hi) hi = x; sim += $8; f += $NF }
        END { if (n) printf "%.3f (%.3f..%.3f) | %.3f | %.3f", s / n, lo, hi, sim / n, f / n; else printf "n/a | n/a | n/a" }'
}
# in_flight NAME: stage 0's peak in flight over the steps, and the schedule's
in_flight() {
    sed -n 's/.*| in flight \([0-9]*\) (schedule \([0-9]*\)).*/\1 \2/p' "$OUT/$1.out" |
        awk '{ if ($1 > pk) pk = $1; sc = $2 } END { printf "%d (schedule %d)", pk, sc }'
}
avg_ms() { sed -n 's/^average step (excluding the first): \([0-9.]*\) ms.*/\1/p' "$OUT/$1.out"; }
flags_of() {   # flags_of SCHEDULE: the trainer's flags for it
    if [ "$1" = interleaved ]; then echo "--pp-schedule interleaved --pp-chunks $CHUNKS"; else echo "--pp-schedule $1"; fi
}
label_of() { if [ "$1" = interleaved ]; then echo "interleaved (v $CHUNKS)"; else echo "$1"; fi; }

noise="$(nproc) cores here: runs with more ranks than cores are oversubscribed (ranks take turns on the cores), so their measured bubbles are noisy and large; the simulated and formula columns, the peaks in flight and the memory are exact."
# other work on the cores slows some stages and not others: the measured bubbles grow with it
load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?")
noise="$noise Load average at the start: $load (above ~0.5 something else is running: the measured bubbles suffer)."
{
echo "# Pipeline-parallel lab ($BIN $MODEL, $STEPS steps)"
echo
echo "Note: $noise"
echo
echo "## Part 1: the bubble against m (micro-batches per step; the global batch stays the same)"
echo
echo "Measured: 1 - busy / (p x the step's pipeline time), mean (min..max) over steps 2..$STEPS. Simulated: the"
echo "schedule run with the measured mean F, B, W times. Formula: (p-1)/(m+p-1), interleaved (p-1)/(v m+p-1),"
echo "ZB-H1 (p-1)(f+b-w)/(m(f+b+w)+(p-1)(f+b-w)) for m >= p: the bubble's share of the whole step. The lecture"
echo "(Narayanan et al.) divides the same idle time by the ideal time instead: (p-1)/m, interleaved (1/v)(p-1)/m"
echo "(p = 4, m = 8: 0.375 there, 0.273 here). In flight: stage 0's peak number of micro-batches"
echo "(x chunks) whose activations it holds, against the schedule's."
echo
echo "| p | schedule | m | measured bubble | simulated (measured F/B/W) | formula | in flight, stage 0 | step ms |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
} | tee "$REPORT"
skipped=""
zb_note=0
for p in $PS; do
    for sched in $SCHEDULES; do
        for m in $MS; do
            if [ "$sched" = interleaved ] && [ $((m % p)) -ne 0 ]; then skipped="$skipped p $p m $m,"; continue; fi
            name="p$p-$sched-m$m"
            trace=""
            [ "$p" = "$TRACE_P" ] && [ "$m" = "$TRACE_M" ] && trace="--trace $OUT/$name.json"
            # shellcheck disable=SC2046,SC2086
            if run "$name" "$p" --pp "$p" $(flags_of "$sched") --grad-accum "$m" $trace; then
                row="$(bubble "$name") | $(in_flight "$name") | $(avg_ms "$name")"
            else
                row="not available: $(why "$name") | | | |"
            fi
            # ZB-H1's formula holds for m >= p only (pp_zbh1.h): marked below it
            if [ "$sched" = zb-h1 ] && [ "$m" -lt "$p" ] && [ "${row#not available}" = "$row" ]; then
                zb_note=1
                row=$(echo "$row" | awk -F' [|] ' '{ $3 = $3 " *"; print }' OFS=' | ')
            fi
            echo "| $p | $(label_of "$sched") | $m | $row |" | tee -a "$REPORT"
        done
    done
done
if [ -n "$skipped" ]; then
    echo "(interleaved needs m a multiple of p: not run for${skipped%,})" | tee -a "$REPORT"
fi
if [ "$zb_note" = 1 ]; then
    echo "(* ZB-H1 with m < p: the formula assumes m >= p; with fewer micro-batches than stages the schedule idles more, the simulation is the reference)" | tee -a "$REPORT"
fi

{
echo
echo "## Part 2: activation memory per stage, p = 4, m = 8 (Part 1's runs)"
echo
echo "Each cell: the activations the stage allocated, for its activation slots (the schedule's peak in flight:"
echo "GPipe m, 1F1B p - s, interleaved in chunk activations, ZB-H1 p with the W inputs kept in the pp buffers)."
echo "Stage 0 also holds the embedding's, stage 3 the LM head's and the loss's. pp buffers: stage 0's (a"
echo "received gradient; ZB-H1 also the output gradients kept for W)."
echo
echo "| schedule | stage 0 | stage 1 | stage 2 | stage 3 | pp buffers, stage 0 |"
echo "|---|---:|---:|---:|---:|---:|"
} | tee -a "$REPORT"
for sched in $SCHEDULES; do
    name="p4-$sched-m8"
    [ -f "$OUT/$name.out" ] || continue
    cells=$(sed -n 's/^  stage \([0-9]*\) .*| \([0-9]*\) activation slots.*activations \([0-9.]*\) MiB.*/\3 MiB (\2 slots)/p' "$OUT/$name.out" |
            awk '{ printf "%s | ", $0 }')
    buffers=$(sed -n 's/^  pp buffers *\([0-9.]*\) MiB.*/\1 MiB/p' "$OUT/$name.out" | head -1)
    if [ -z "$cells" ]; then cells="not available: $(why "$name") | | | | "; fi
    echo "| $(label_of "$sched") | $cells${buffers:-n/a} |" | tee -a "$REPORT"
done

{
echo
echo "## Part 3: measured timelines of one step, p = $TRACE_P, m = $TRACE_M (scripts/pp_timeline.py)"
echo
} | tee -a "$REPORT"
py=""
for cand in /usr/bin/python3 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import matplotlib" >/dev/null 2>&1; then py=$cand; break; fi
done
for pair in "1f1b:pipeline-parallel-timeline.png" "zb-h1:pipeline-parallel-timeline-zb.png" \
            "interleaved:pipeline-parallel-timeline-interleaved.png" "gpipe:pipeline-parallel-timeline-gpipe.png"; do
    sched=${pair%%:*} png="$DOC/${pair#*:}"
    name="p$TRACE_P-$sched-m$TRACE_M"
    case " $SCHEDULES " in *" $sched "*) ;; *) continue ;; esac
    if [ ! -f "$OUT/$name.json" ]; then
        echo "- $(label_of "$sched"): not available (the run failed: $(why "$name"))" | tee -a "$REPORT"
        continue
    fi
    "${py:-python3}" scripts/pp_timeline.py "$OUT/$name.json" "$png" --optional \
        --title "$(label_of "$sched"), measured on $(nproc) CPU cores ($BIN)" >"$OUT/$name.timeline" 2>&1 ||
        { echo "lab_pp: pp_timeline.py failed on $OUT/$name.json:" >&2; tail -5 "$OUT/$name.timeline" >&2; failed+=("$name timeline"); continue; }
    b=$(sed -n 's/^  measured bubble \([0-9.]*\).*/\1/p' "$OUT/$name.timeline")
    step=$(sed -n 's/.*: step \([0-9]*\) of.*/\1/p' "$OUT/$name.timeline")
    if grep -q '^pp_timeline: wrote' "$OUT/$name.timeline"; then where="$png"; else where="not drawn (no matplotlib: bash scripts/install_deps.sh --lab)"; fi
    echo "- $(label_of "$sched"): step $step, measured bubble $b: $where" | tee -a "$REPORT"
done

echo
echo "lab time: $(( $(date +%s) - start )) s"
echo "lab_pp: tables in $REPORT, every run's output (and the p = $TRACE_P, m = $TRACE_M traces) in $OUT/"
echo "Note: $noise"
if [ ${#failed[@]} -gt 0 ]; then
    echo "lab_pp: ${#failed[@]} run(s) failed: ${failed[*]} (their rows say \"not available\"; outputs in $OUT/)" >&2
    exit 1
fi
