#!/usr/bin/env bash
# Lab: context parallelism (llmc/parallel/cp.h, doc/context-parallel.md).
#   One long-sequence model on cp = 1, 2, 4 ranks (mpirun -np cp), for each attention algorithm
#   (--cp-algo ring, allgather, alltoall) and, for ring and allgather, both splits of the
#   sequence (--cp-split zigzag, plain). Per run, from the trainer's own lines:
#     - activations per rank (the "cp memory" line; cp = 1: the single-rank "memory" line) and the
#       attention's share of them, and the cp scratch buffers;
#     - the bytes this rank sent on the cp group per step, counted, beside cp.h's formula
#       ("cp comm | sent X MiB (formula Y MiB, equal)"; --comm-algo ring, so that allgather's
#       and alltoall's collectives are ours and counted), and the dp x cp gradient all-reduce;
#     - the attention work of each rank in (query, key) pairs per layer, sequence and head (the
#       "attention work per rank" line, from the split) and the max/min counted while it ran;
#     - the step time, the cp communication time not hidden, and the last step's loss (the same
#       on every row: every configuration computes the single-rank step).
# The table goes to stdout and, as markdown, to $OUT/table.md; every run's output to $OUT/.
#
# The model: 4 layers, 4 heads, C 64 at T = 1024 (batch 2, random tokens with --bench): the
# attention is most of the activations and over half of the FLOPs, which is where CP pays. About
# 20 s on 2 idle CPU cores (under a minute when other work shares them). The cp = 4 runs are
# oversubscribed there (4 ranks take turns on 2 cores), and cp = 2 uses two cores where cp = 1
# uses one: the step times compare little; the bytes, memory and pairs are exact. Last, it checks
# that alltoall refuses a cp the heads do not divide (cp 8 with 4 heads; 8 ranks that stop at
# set-up).
# Knobs (environment): BIN (default ./train_gpt2cpu), CPS ("2 4"), CONFIGS ("ring:zigzag
# ring:plain allgather:zigzag allgather:plain alltoall:zigzag"), STEPS (5), MODEL, OUT
# (build/lab-cp), MPIRUN (mpirun --oversubscribe), LIMIT_CHECK (1).
#   bash scripts/lab_cp.sh
#   BIN=./train_gpt2cu MODEL="--model gpt2 --max-seq 8192 --seq 8192 --batch 1" bash scripts/lab_cp.sh   # on GPUs (not yet run)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_gpt2cpu}
CPS=${CPS:-"2 4"}
CONFIGS=${CONFIGS:-"ring:zigzag ring:plain allgather:zigzag allgather:plain alltoall:zigzag"}
STEPS=${STEPS:-5}
MODEL=${MODEL:-"--layers 4 --heads 4 --channels 64 --max-seq 1024 --seq 1024 --batch 2"}
OUT=${OUT:-build/lab-cp}
LIMIT_CHECK=${LIMIT_CHECK:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=${MPIRUN:-"mpirun --oversubscribe"}
mkdir -p "$OUT"
# the trainer: built when missing or older than its sources (another make may be running: a
# failed build is reported, not retried)
if [ "$BIN" = ./train_gpt2cpu ] &&
   { [ ! -x "$BIN" ] || [ -n "$(find llmc train_gpt2.cu -newer "$BIN" -print -quit)" ]; }; then
    make train_gpt2cpu >"$OUT/make.log" 2>&1 || { echo "lab_cp: make train_gpt2cpu failed:"; tail -20 "$OUT/make.log"; exit 1; }
fi
[ -x "$BIN" ] || { echo "lab_cp: no trainer $BIN"; exit 1; }
command -v mpirun >/dev/null || { echo "lab_cp: needs mpirun (bash scripts/install_deps.sh)"; exit 1; }
COMMON="--bench --steps $STEPS --eval-every 0 --sample-every 0 --accuracy 0 --threads 1 --comm-algo ring"
REPORT="$OUT/table.md"
start=$(date +%s)
failed=()

# run NAME NP FLAGS...: the trainer (NP 1: one process, no mpirun); its output in $OUT/NAME.out
run() {
    local name=$1 np=$2; shift 2
    local cmd
    # shellcheck disable=SC2086
    if [ "$np" = 1 ]; then cmd="$BIN $MODEL $COMMON $*"; else cmd="$MPIRUN -np $np $BIN $MODEL $COMMON $*"; fi
    echo "$cmd" >"$OUT/$name.cmd"
    # shellcheck disable=SC2086
    if ! $cmd >"$OUT/$name.out" 2>&1; then
        echo "lab_cp: run $name failed ($OUT/$name.out): $(why "$name")" >&2
        failed+=("$name")
        return 1
    fi
}
why() { { grep -m1 '^error:' "$OUT/$1.out" || tail -1 "$OUT/$1.out"; } | sed 's/^error: //; s/|/\\|/g'; }
avg_ms() { sed -n 's/^average step (excluding the first): \([0-9.]*\) ms.*/\1/p' "$OUT/$1.out"; }
last_loss() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([0-9.]*\) .*/\1/p' "$OUT/$1.out" | tail -1; }
# the cp lines of a run: activations, attention state, scratch; pairs per rank; bytes and times
cp_mem() {      # activations | attention state | the rest (the token-wise activations) | scratch
    sed -n 's/^  cp memory *activations \([0-9.]*\) MiB .*attention state \([0-9.]*\) MiB), cp scratch \([0-9.]*\) MiB.*/\1 \2 \3/p' "$OUT/$1.out" |
        awk '{ printf "%s | %s | %.3f | %s", $1, $2, $1 - $2, $3 }'
}
cp_pairs() {   # r0's and the last rank's pairs (the least and the most loaded with the plain split)
    grep -m1 'attention work per rank' "$OUT/$1.out" | sed 's/.*head://; s/|.*//' |
        awk '{ printf "%s .. %s", $2, $NF }'
}
cp_sent() {    # the last step's counted bytes (formula), and whether every step was "equal"
    local f="$OUT/$1.out" n ok
    n=$(grep -c '^  cp comm | sent' "$f" || true)
    ok=$(grep -c '^  cp comm | sent.*, equal)' "$f" || true)
    grep '^  cp comm | sent' "$f" | tail -1 |
        sed -n 's/.*sent *\([0-9.]*\) MiB by this rank (formula *\([0-9.]*\) MiB.*/\1 (\2)/p' | tr -d '\n'
    if [ "$n" -gt 0 ] && [ "$n" = "$ok" ]; then echo " equal"; else echo " DIFFERENT on $((n - ok)) of $n steps"; fi
}
cp_ratio() { grep '^  cp comm |' "$OUT/$1.out" | tail -1 | sed -n 's/.*max\/min \([0-9.]*\).*/\1/p'; }
cp_wait() {    # mean over steps 2..N of the cp communication time not hidden
    grep '^  cp comm |' "$OUT/$1.out" | sed -n 's/.*calls, \([0-9.]*\) ms.*/\1/p' |
        awk 'NR > 1 { s += $1; n++ } END { if (n) printf "%.1f", s / n; else printf "n/a" }'
}
dp_sent() { grep -m1 '^ *comm | sent' "$OUT/$1.out" | sed -n 's/.*sent *\([0-9.]*\) MiB.*/\1/p'; }

noise="$(nproc) cores here, one thread per rank: cp 2 uses 2 cores where cp 1 uses one, and cp 4's ranks take turns on them, so the step times compare little; bytes, memory and pairs are exact. Load average at the start: $(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')."
{
echo "# Context-parallel lab ($BIN $MODEL, $STEPS steps, random tokens)"
echo
echo "Activations: MiB per rank (the trainer's cp memory line; cp 1 its memory line, rounded to 0.1), of which the"
echo "attention's saved state, and the rest (activations - attention state: the token-wise ones). cp MiB / step: sent by rank 0 on the cp group in the last step, counted (cp.h's formula);"
echo "\"equal\" when every step's count equalled the formula. Pairs: (query, key) pairs per layer, sequence and head, of"
echo "rank 0 .. rank cp-1, from the split; max/min counted during the last step. cp wait: cp communication not hidden"
echo "behind compute, mean over steps 2..$STEPS. dp x cp: the gradient all-reduce over the dp x cp group."
echo
echo "| cp | algo | split | activations / rank MiB | attention state MiB | rest MiB | cp scratch MiB | cp MiB / step (formula) | dp x cp MiB / step | pairs r0 .. r(cp-1) | max/min | step ms | cp wait ms | loss, last step |"
echo "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} | tee "$REPORT"

# cp = 1: the whole sequence on one rank; the attention keeps B NH T^2 probabilities (fp32) per layer
if run cp1 1; then
    acts=$(sed -n 's/^memory .*activations \([0-9.]*\) MiB.*/\1/p' "$OUT/cp1.out")
    read -r L NH B T < <(echo "$MODEL" | awk '{ for (i = 1; i < NF; i++) { if ($i == "--layers") l = $(i+1); if ($i == "--heads") h = $(i+1);
        if ($i == "--batch") b = $(i+1); if ($i == "--seq") t = $(i+1) } } END { print l, h, b, t }')
    # (the formula is the CPU kernel's probability matrix; CUDA's flash attention keeps B NH T floats)
    if [ -n "$L" ] && [ -n "$NH" ] && [ -n "$B" ] && [ -n "$T" ] && [[ "$BIN" == *cpu* ]]; then
        att=$(awk -v l="$L" -v h="$NH" -v b="$B" -v t="$T" 'BEGIN { printf "%.3f", l * b * h * t * t * 4 / 1048576 }')
        rest=$(awk -v a="$acts" -v s="$att" 'BEGIN { printf "%.1f", a - s }')
        att="$att (L B NH T^2 4 B)"
        pairs=$(awk -v t="$T" 'BEGIN { printf "%d (T(T+1)/2)", t * (t + 1) / 2 }')
    else
        att="n/a" pairs="n/a" rest="n/a"
    fi
    echo "| 1 | - | - | $acts | $att | $rest | 0 | 0 | 0 | $pairs | 1 | $(avg_ms cp1) | 0 | $(last_loss cp1) |" | tee -a "$REPORT"
else
    echo "| 1 | - | - | not available: $(why cp1) | | | | | | | | | | |" | tee -a "$REPORT"
fi

for cp in $CPS; do
    for config in $CONFIGS; do
        algo=${config%%:*} split=${config#*:}
        name="cp$cp-$algo-$split"
        if run "$name" "$cp" --cp "$cp" --cp-algo "$algo" --cp-split "$split"; then
            row="$(cp_mem "$name") | $(cp_sent "$name") | $(dp_sent "$name") | $(cp_pairs "$name") | $(cp_ratio "$name") | $(avg_ms "$name") | $(cp_wait "$name") | $(last_loss "$name")"
        else
            row="not available: $(why "$name") | | | | | | | | | |"
        fi
        echo "| $cp | $algo | $split | $row |" | tee -a "$REPORT"
    done
done

if [ "$LIMIT_CHECK" = 1 ]; then
    # Ulysses splits the heads over the cp ranks: with 4 heads, cp 8 must be refused at set-up
    name="cp8-alltoall-refused"
    {
    echo
    echo "Limit of alltoall (Ulysses): --cp 8 --cp-algo alltoall with this model's heads on 8 ranks:"
    } | tee -a "$REPORT"
    # shellcheck disable=SC2086
    if $MPIRUN -np 8 $BIN $MODEL $COMMON --steps 1 --cp 8 --cp-algo alltoall >"$OUT/$name.out" 2>&1; then
        echo "- it ran (not refused): see $OUT/$name.out" | tee -a "$REPORT"
        failed+=("$name")
    else
        echo "- refused: \`$(grep -m1 'error:' "$OUT/$name.out" | sed 's/^error: //; s/ \[rank [0-9]*\]//')\`" | tee -a "$REPORT"
    fi
fi

{
echo
echo "Note: $noise"
} | tee -a "$REPORT"
echo
echo "lab time: $(( $(date +%s) - start )) s"
echo "lab_cp: table in $REPORT, every run's output in $OUT/"
if [ ${#failed[@]} -gt 0 ]; then
    echo "lab_cp: ${#failed[@]} run(s) failed: ${failed[*]} (outputs in $OUT/)" >&2
    exit 1
fi
