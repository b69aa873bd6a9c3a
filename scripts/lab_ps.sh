#!/usr/bin/env bash
# The parameter-server lab (doc/parameter-server.md): the three reliefs of the server bottleneck
# in the lecture "Data Parallelism in LLM Training", each measured on CPU ranks.
#   PARTS=sched,async,compress   which parts (default: all three)
#   OUT=dir                      where the tables, logs and plots go (default build/lab-ps)
#   NP=4                         ranks for the scheduling part
#   STEPS=60                     steps of the scheduling part (the other parts take their own STEPS:
#                                scripts/lab_ps_async.sh, scripts/lab_ps_compress.sh)
# Part "sched" (this file): the default model (6 layers, C 128) on NP ranks, one server; the plain
# parameter server, then its push/pull in 16 KiB layer-wise chunks first come first served and by
# priority (llmc/parallel/dp_priority.h): how many pull chunks the forward of block 0 waited for
# (counted: the same on every run), the time from the update to the next forward of block 0,
# when the last parameter chunk arrived, the step time (measured: they depend on the machine and
# its load, so test/test_ps_sched.sh checks the counts and this lab the times); and a trace per
# order to open in ui.perfetto.dev; the same with 64 KiB chunks. At the end, priority's time to
# the next forward against fifo's, per chunk size. About 3 minutes on 2 cores.
set -u
cd "$(dirname "$0")/.."
PARTS=${PARTS:-sched,async,compress}
OUT=${OUT:-build/lab-ps}
NP=${NP:-4}
STEPS=${STEPS:-60}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
make -s train_gpt2cpu data >/dev/null || { echo "error: make train_gpt2cpu data failed"; exit 1; }

if [[ ,$PARTS, == *,sched,* ]]; then
    QUIET="--eval-every 0 --accuracy 0 --sample-every 0 --threads 1 --steps $STEPS"
    table="$OUT/sched.md"
    {
        echo "| run ($NP ranks, 1 server, default model, $STEPS steps) | block 0 waited for (pull chunks) | update -> next forward of block 0 | last parameter chunk | step time |"
        echo "|---|---|---|---|---|"
    } >"$table"
    declare -A FIRST   # per run: ms from the update to the next forward of block 0
    for entry in "plain parameter server|--dp-mode ps" \
                 "16 KiB chunks, fifo|--dp-mode ps --comm-chunk-kb 16 --comm-order fifo" \
                 "16 KiB chunks, priority|--dp-mode ps --comm-chunk-kb 16 --comm-order priority" \
                 "64 KiB chunks, fifo|--dp-mode ps --comm-chunk-kb 64 --comm-order fifo" \
                 "64 KiB chunks, priority|--dp-mode ps --comm-chunk-kb 64 --comm-order priority"; do
        name=${entry%%|*}
        flags=${entry#*|}
        tag=$(echo "$name" | tr -c 'a-z0-9\n' '-')
        trace="--trace $OUT/$tag.json"
        echo "== $name"
        # shellcheck disable=SC2086
        $MPIRUN -np "$NP" ./train_gpt2cpu $QUIET $flags $trace >"$OUT/$tag.out" 2>&1 || { echo "error: the run failed: $OUT/$tag.out"; exit 1; }
        step=$(sed -n 's/^average step (excluding the first): \([0-9.]*\) ms.*/\1/p' "$OUT/$tag.out")
        line=$(grep "^layer-wise pull (.* steps): the next forward started" "$OUT/$tag.out")
        first=$(echo "$line" | sed -n 's/.*started \([0-9.]*\) ms.*/\1/p')
        last=$(echo "$line" | sed -n 's/.*arrived after \([0-9.]*\) ms.*/\1/p')
        # counted: "waited for 58 of the 352 chunks" (the trainer's summary)
        waited=$(sed -n 's/^layer-wise pull (.* pulls): .*waited for \([0-9]* of the [0-9]*\) chunks.*/\1/p' "$OUT/$tag.out")
        [ -n "$waited" ] || waited="all (one message per worker)"
        if [ -z "$line" ]; then   # the plain server pulls inside the update: the forward starts after all of it
            pull=$(python3 -c "
import json, sys
t = json.load(open(sys.argv[1])); ev = t['traceEvents'] if isinstance(t, dict) else t
d = [e['dur'] for e in ev if e.get('pid') == 0 and e.get('name') == 'pull parameters'][1:]
print('%.2f' % (sum(d) / len(d) / 1e3))" "$OUT/$tag.json")
            first="$pull ms (the whole pull, inside the update)"; last="$pull ms"
        else
            first="$first ms"; last="$last ms"
        fi
        echo "| $name | $waited | $first | $last | $step ms |" >>"$table"
        FIRST[$name]=${first% ms*}
        if [[ $flags == *chunk* ]]; then
            python3 test/ps_sched_trace.py "$OUT/$tag.json" >"$OUT/$tag.txt"
            head -1 "$OUT/$tag.txt" | sed "s/^/   /"
        fi
    done
    echo
    cat "$table"
    # the measured gain of the order: the time from the update to the next forward of block 0
    echo
    for kb in 16 64; do
        fp=${FIRST["$kb KiB chunks, priority"]} ff=${FIRST["$kb KiB chunks, fifo"]}
        echo "$kb KiB chunks: update -> next forward of block 0 by priority $fp ms, fifo $ff ms:" \
             "$(awk -v p="$fp" -v f="$ff" 'BEGIN {if (f > 0) printf "priority takes %.2f x fifo'"'"'s time%s", p / f, p < f ? "" : " (NOT below fifo: a loaded machine?)"}')"
    done | tee "$OUT/sched-gain.txt"
fi

if [[ ,$PARTS, == *,async,* ]]; then
    OUT="$OUT/async" bash scripts/lab_ps_async.sh || exit 1
fi
if [[ ,$PARTS, == *,compress,* ]]; then
    OUT="$OUT/compress" bash scripts/lab_ps_compress.sh || exit 1
fi
