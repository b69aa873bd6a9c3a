#!/usr/bin/env bash
# shellcheck disable=SC2086  # flag strings ($MOE_A, $QUIET, ...) are split into words on purpose
# Lab: mixture of experts and expert parallelism (llmc/model/moe_block.h, llmc/parallel/ep.h,
# doc/expert-parallel.md). Four parts, every figure read from the trainer's own lines:
#   (a) tokens per expert over training with and without the load-balancing loss (--moe-aux 0.01
#       against 0), E 4, top-1, ONE MoE block (--moe-every 6: block 5; the trainer's line sums the
#       MoE blocks, which can hide a block's collapse), with a capacity factor of E/k (cap = T:
#       nothing can be dropped, so the counts are the router's own choices): the per-step
#       "moe | tokens per expert [...]" lines to a CSV and a plot (matplotlib if python3 or
#       /usr/bin/python3 has it, otherwise an ASCII chart in the table), and the max/mean load
#       imbalance at the start and at the end;
#   (b) dropped (token, expert) pairs against the capacity factor (0.5 1.0 1.25 2.0) at E 4, k 1
#       and k 2, beside the floor that capacity alone imposes;
#   (c) dense against MoE at equal ACTIVE parameters on the default task (the tiny model on the
#       arithmetic sums): the dense model against top-1 of E 4 experts every 2nd block (each token
#       runs one expert MLP, the size of the dense one: the same active parameters, plus the
#       router's E C per MoE block): last step's train loss, val loss, held-out exact match;
#   (d) expert parallelism: --ep 2 on 2 ranks against one rank (same loss, same tokens per
#       expert), the all-to-all bytes counted every step against the formula from the routing and
#       against the balanced estimate; and dp 4 x ep 2 on 4 ranks (the edp all-reduce).
# The table goes to stdout and, as markdown, to $OUT/table.md; the CSV and the plot beside it;
# every run's output in $OUT/. Runs go two at a time (one thread each) on the 2 cores.
#
# About 4 minutes on 2 CPU cores shared with other jobs (238 s at load average 6.6; 152 s of CPU). Exact match on the sums arrives only after hundreds
# of steps (doc/training-tasks.md), so part (c)'s accuracy at the lab's 200 steps is
# near 0 for both models: C_STEPS=800 bash scripts/lab_moe.sh for the comparison that matters
# (doc/expert-parallel.md has it, ~10 min).
# Knobs (environment): BIN (./train_gpt2cpu), OUT (build/lab-moe), A_STEPS (150), A_BATCH (16),
# A_CAP (4), B_STEPS (25), B_BATCH (16), CFS ("0.5 1.0 1.25 2.0"), C_STEPS (200), C_ACC (200),
# D_STEPS (5), EP4 (1: the dp 4 x ep 2 run), MPIRUN (mpirun --oversubscribe).
#   bash scripts/lab_moe.sh
#   C_STEPS=800 C_ACC=500 bash scripts/lab_moe.sh
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=${BIN:-./train_gpt2cpu}
OUT=${OUT:-build/lab-moe}
A_STEPS=${A_STEPS:-150}
A_BATCH=${A_BATCH:-16}
A_CAP=${A_CAP:-4}
B_STEPS=${B_STEPS:-25}
B_BATCH=${B_BATCH:-16}
CFS=${CFS:-"0.5 1.0 1.25 2.0"}
C_STEPS=${C_STEPS:-200}
C_ACC=${C_ACC:-200}
D_STEPS=${D_STEPS:-5}
EP4=${EP4:-1}
MPIRUN=${MPIRUN:-"mpirun --oversubscribe"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

[ -x "$BIN" ] || { echo "lab_moe: no trainer $BIN: build it first (make train_gpt2cpu)" >&2; exit 1; }
if ! "$BIN" --help 2>&1 | grep -q -- '--moe-experts'; then
    echo "lab_moe: $BIN has no --moe-experts: rebuild it (make train_gpt2cpu)" >&2; exit 1
fi
if [ "$BIN" = ./train_gpt2cpu ] && [ -n "$(find llmc train_gpt2.cu -newer "$BIN" -print -quit 2>/dev/null)" ]; then
    echo "lab_moe: note: $BIN is older than some sources in llmc/ (make train_gpt2cpu to rebuild)" >&2
fi
command -v mpirun >/dev/null || { echo "lab_moe: needs mpirun for part (d) (bash scripts/install_deps.sh)" >&2; exit 1; }
mkdir -p "$OUT"
# the arithmetic data (make train's setup); a private copy when it is missing
DATA=""
if [ ! -f data/arithmetic/train_000000.bin ] || [ ! -f data/arithmetic/val_000000.bin ]; then
    if [ ! -f "$OUT/data/train_000000.bin" ]; then
        python3 dev/data/arithmetic.py --out-dir "$OUT/data" --num-train 4000 --num-val 300 >/dev/null ||
            { echo "lab_moe: no data/arithmetic and generating $OUT/data failed" >&2; exit 1; }
    fi
    DATA="--train-data $OUT/data/train_*.bin --val-data $OUT/data/val_*.bin --tokenizer $OUT/data/tokenizer.bin"
fi
# --seq 64: the lab's shapes (capacity per sequence, tokens per step) were designed on rows of 64
# tokens, the default job's before issue 57 (today's default rows are one 11-token example)
QUIET="--eval-every 0 --sample-every 0 --threads 1 --seq 64 $DATA"
REPORT="$OUT/table.md"
CSV="$OUT/tokens_per_expert.csv"
PNG="$OUT/tokens_per_expert.png"
start=$(date +%s)
failed=()

# launch NAME NP FLAGS...: the trainer in the background (NP 1: no mpirun), output in $OUT/NAME.out,
# exit status in $OUT/NAME.rc; finish waits for the launched runs and records the failures
pids=()
names=()
launch() {
    local name=$1 np=$2; shift 2
    local cmd
    if [ "$np" = 1 ]; then cmd="$BIN $QUIET $*"; else cmd="$MPIRUN -np $np $BIN $QUIET $*"; fi
    echo "$cmd" >"$OUT/$name.cmd"
    # shellcheck disable=SC2086
    ( $cmd >"$OUT/$name.out" 2>&1; echo $? >"$OUT/$name.rc" ) &
    pids+=($!)
    names+=("$name")
}
finish() {
    local i
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}"
        if [ "$(cat "$OUT/${names[$i]}.rc" 2>/dev/null)" != 0 ]; then
            echo "lab_moe: run ${names[$i]} failed ($OUT/${names[$i]}.out): $(why "${names[$i]}")" >&2
            failed+=("${names[$i]}")
        fi
    done
    pids=()
    names=()
}
ok() { [ "$(cat "$OUT/$1.rc" 2>/dev/null)" = 0 ]; }
why() { { grep -m1 'error' "$OUT/$1.out" || tail -1 "$OUT/$1.out"; } | sed 's/^error: //; s/|/\\|/g'; }
# the per-step figures of a run: "step loss e0 e1 ... dropped pairs aux" (one line per step)
steps() {
    awk '/^step +[0-9]+\/[0-9]+ \| loss/ { split($2, s, "/"); step = s[1]; loss = $5 }
         /^ +moe \| tokens per expert/ {
             line = $0; sub(/.*\[/, "", line); t = line; sub(/\].*/, "", t)
             d = line; sub(/.*dropped /, "", d); split(d, dd, " ")
             a = line; sub(/.*aux loss /, "", a)
             print step, loss, t, dd[1], dd[3], a }' "$OUT/$1.out"
}
last_loss() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([0-9.]*\) .*/\1/p' "$OUT/$1.out" | tail -1; }
val_loss() { sed -n 's/^val loss \([0-9.]*\).*/\1/p' "$OUT/$1.out" | tail -1; }
accuracy() { sed -n 's/.*accuracy \([0-9.]*\)% (exact match.*/\1/p' "$OUT/$1.out" | tail -1; }
avg_ms() { sed -n 's/^average step (excluding the first): \([0-9.]*\) ms.*/\1/p' "$OUT/$1.out"; }

load="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')"
echo "# MoE lab ($BIN, the tiny model: L 6, C 128, 4 heads, T 64; $(nproc) cores, load average $load at the start)" | tee "$REPORT"

# ---------------------------------------------------------------------------------------------
# (a) tokens per expert over training, with and without the aux loss
MOE_A="--moe-experts 4 --moe-topk 1 --moe-every 6 --moe-capacity $A_CAP --batch $A_BATCH --steps $A_STEPS --accuracy 0 --eval-batches 1"
launch a-aux 1 $MOE_A --moe-aux 0.01
launch a-noaux 1 $MOE_A --moe-aux 0
finish
echo "run,step,loss,e0,e1,e2,e3,dropped,pairs,aux,max_over_mean" >"$CSV"
for r in a-aux a-noaux; do
    ok "$r" || continue
    steps "$r" | awk -v r="$r" '{ m = 0; s = 0; for (i = 3; i <= 6; i++) { s += $i; if ($i > m) m = $i }
        printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%.4f\n", r, $1, $2, $3, $4, $5, $6, $7, $8, $9, s ? m / (s / 4) : 0 }' >>"$CSV"
done
# imbalance RUN FROM TO: mean of max/mean over steps FROM..TO
imbalance() { awk -F, -v r="$1" -v a="$2" -v b="$3" '$1 == r && $2 >= a && $2 <= b { s += $11; n++ } END { if (n) printf "%.3f", s / n; else printf "n/a" }' "$CSV"; }
lastcounts() { awk -F, -v r="$1" '$1 == r { c = $4 " " $5 " " $6 " " $7 } END { printf "[%s]", c }' "$CSV"; }
lastdrop() { awk -F, -v r="$1" '$1 == r { d = $8; p = $9 } END { if (p) printf "%.1f%%", 100 * d / p; else printf "n/a" }' "$CSV"; }
q=$((A_STEPS / 5)); [ "$q" -lt 1 ] && q=1
{
echo
echo "## (a) Tokens per expert over training, with and without the load-balancing loss"
echo
echo "E 4, top-1, one MoE block (block 5 of 6: --moe-every 6), batch $A_BATCH x 64 tokens, $A_STEPS steps, capacity factor $A_CAP"
echo "(cap = ceil($A_CAP x 64 / 4); at $A_CAP >= E/k = 4 it is T: nothing dropped, the counts are the router's choices). Tokens"
echo "per expert: the step's (token, expert) pairs ($A_BATCH x 64 = $((A_BATCH * 64)) per step). Imbalance: max / mean"
echo "of the 4 counts (1 = uniform, 4 = every token on one expert), averaged over the steps named. CSV: $CSV."
echo
echo "| aux coefficient | imbalance steps 1-$q | steps $((A_STEPS - q + 1))-$A_STEPS | last step's counts | dropped (last step) | aux loss (last step) | train loss incl. aux (last step) |"
echo "|---:|---:|---:|---|---:|---:|---:|"
for r in a-aux a-noaux; do
    c=0.01; [ "$r" = a-noaux ] && c=0
    if ok "$r"; then
        aux=$(awk -F, -v r="$r" '$1 == r { a = $10 } END { print a }' "$CSV")
        echo "| $c | $(imbalance "$r" 1 "$q") | $(imbalance "$r" $((A_STEPS - q + 1)) "$A_STEPS") | $(lastcounts "$r") | $(lastdrop "$r") | $aux | $(last_loss "$r") |"
    else
        echo "| $c | not available: $(why "$r") | | | | | |"
    fi
done
echo
echo "(With --moe-aux 0 the printed aux loss is alpha E sum f P = 0; the router still learns from the task's gradient"
echo "through the gate g = p of the chosen expert.)"
} | tee -a "$REPORT"

# the plot: matplotlib if a python3 has it, else an ASCII chart of the imbalance
py=""
for cand in python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import matplotlib" >/dev/null 2>&1; then py=$cand; break; fi
done
if [ -n "$py" ] && [ -s "$CSV" ]; then
    "$py" - "$CSV" "$PNG" <<'EOF'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
for ax, run, title in ((axes[0], "a-aux", "--moe-aux 0.01"), (axes[1], "a-noaux", "--moe-aux 0")):
    rs = [r for r in rows if r["run"] == run]
    steps = [int(r["step"]) for r in rs]
    for e in range(4):
        tot = [sum(int(r["e%d" % i]) for i in range(4)) for r in rs]
        ax.plot(steps, [int(r["e%d" % e]) / t if t else 0 for r, t in zip(rs, tot)], label="expert %d" % e)
    ax.axhline(0.25, color="grey", lw=0.8, ls="--")
    ax.set_title("share of the tokens per expert, " + title)
    ax.set_xlabel("step"); ax.set_ylim(0, 1); ax.legend(fontsize=8)
for run, title in (("a-aux", "aux 0.01"), ("a-noaux", "aux 0")):
    rs = [r for r in rows if r["run"] == run]
    axes[2].plot([int(r["step"]) for r in rs], [float(r["max_over_mean"]) for r in rs], label=title)
axes[2].set_title("load imbalance: max / mean tokens per expert"); axes[2].set_xlabel("step")
axes[2].set_ylim(1, 4); axes[2].legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=90)
EOF
    [ -s "$PNG" ] && echo "plot: $PNG" | tee -a "$REPORT"
else
    {
    echo
    echo "No matplotlib: the imbalance (max/mean) over training as an ASCII chart, one row per $q steps (mean),"
    echo "\`#\` aux 0.01, \`o\` aux 0, scale 1 (left) to 4 (right):"
    echo
    echo '```'
    for ((s = 1; s <= A_STEPS; s += q)); do
        e=$((s + q - 1))
        x=$(imbalance a-aux "$s" "$e"); y=$(imbalance a-noaux "$s" "$e")
        awk -v s="$s" -v e="$e" -v x="$x" -v y="$y" 'BEGIN { bx = int((x - 1) * 20 + 0.5); by = int((y - 1) * 20 + 0.5)
            l1 = ""; l2 = ""; for (i = 0; i < bx; i++) l1 = l1 "#"; for (i = 0; i < by; i++) l2 = l2 "o"
            printf "steps %4d-%-4d aux 0.01 %5s |%s\n                aux 0    %5s |%s\n", s, e, x, l1, y, l2 }'
    done
    echo '```'
    } | tee -a "$REPORT"
fi

# ---------------------------------------------------------------------------------------------
# (b) dropped pairs against the capacity factor
runs=()
for k in 1 2; do
    for cf in $CFS; do
        runs+=("b-k$k-cf$cf:$k:$cf")
    done
done
n=0
for spec in "${runs[@]}"; do
    IFS=: read -r name k cf <<<"$spec"
    launch "$name" 1 --moe-experts 4 --moe-topk "$k" --moe-capacity "$cf" --batch "$B_BATCH" --steps "$B_STEPS" --accuracy 0 --eval-batches 1
    n=$((n + 1))
    if [ $((n % 2)) = 0 ]; then finish; fi
done
finish
{
echo
echo "## (b) Dropped pairs against the capacity factor"
echo
echo "E 4, 3 MoE blocks, batch $B_BATCH x T 64, aux 0.01, $B_STEPS steps from the same initial weights. cap = ceil(cf T k / E)"
echo "per expert and sequence. Floor: the share capacity alone must drop, max(0, 1 - E cap / (T k)) (the 4 experts"
echo "take at most E cap of a sequence's T k pairs). Dropped: pairs dropped / pairs over all the steps, and over the last 5."
echo
echo "| k | capacity factor | cap (of T k pairs) | floor | dropped, all steps | dropped, last 5 steps | train loss (last step) |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for spec in "${runs[@]}"; do
    IFS=: read -r name k cf <<<"$spec"
    cap=$(awk -v c="$cf" -v k="$k" 'BEGIN { x = c * 64 * k / 4; y = int(x); if (y < x) y++; print y }')
    floor=$(awk -v cap="$cap" -v k="$k" 'BEGIN { f = 1 - 4 * cap / (64 * k); if (f < 0) f = 0; printf "%.1f%%", 100 * f }')
    if ok "$name"; then
        all=$(steps "$name" | awk '{ d += $(NF-2); p += $(NF-1) } END { if (p) printf "%.1f%%", 100 * d / p }')
        last=$(steps "$name" | tail -5 | awk '{ d += $(NF-2); p += $(NF-1) } END { if (p) printf "%.1f%%", 100 * d / p }')
        echo "| $k | $cf | $cap (of $((64 * k))) | $floor | $all | $last | $(last_loss "$name") |"
    else
        echo "| $k | $cf | $cap | $floor | not available: $(why "$name") | | |"
    fi
done
} | tee -a "$REPORT"

# ---------------------------------------------------------------------------------------------
# (c) dense vs MoE at equal active parameters, the default task
launch c-dense 1 --steps "$C_STEPS" --accuracy "$C_ACC"
launch c-moe 1 --steps "$C_STEPS" --accuracy "$C_ACC" --moe-experts 4 --moe-topk 1
finish
params() { sed -n 's/^model .*: \([0-9]*\) parameters.*/\1/p' "$OUT/$1.out" | head -1; }
active() { sed -n 's/^moe params .* \([0-9]*\) active per token.*/\1/p' "$OUT/$1.out" | head -1; }
{
echo
echo "## (c) Dense against MoE at equal active parameters (the default task, $C_STEPS steps)"
echo
echo "The default job shortened to $C_STEPS steps (its batch, lr and cosine schedule, the arithmetic sums). MoE: top-1 of 4 experts"
echo "in blocks 1, 3, 5, each expert the dense MLP's size, capacity 1.25, aux 0.01. Active: parameters a token runs through."
echo "Accuracy: greedy exact match on $C_ACC held-out sums."
echo
echo "The printed train loss of an MoE model includes the aux loss (section 4 of the doc); the validation loss is the"
echo "cross-entropy alone. Train CE = train loss - aux, the last step's (for the dense model aux = 0)."
echo
echo "| model | parameters | active per token | train loss (last step) | aux | train CE | val loss | accuracy | step ms |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for r in c-dense c-moe; do
    if ok "$r"; then
        act=$(active "$r"); [ -z "$act" ] && act=$(params "$r")
        loss=$(last_loss "$r")
        aux=$(steps "$r" | tail -1 | awk '{ print $NF }'); [ -z "$aux" ] && aux=0
        ce=$(awk -v l="$loss" -v a="$aux" 'BEGIN { printf "%.4f", l - a }')
        echo "| ${r#c-} | $(params "$r") | $act | $loss | $aux | $ce | $(val_loss "$r") | $(accuracy "$r")% | $(avg_ms "$r") |"
    else
        echo "| ${r#c-} | not available: $(why "$r") | | | | | | | |"
    fi
done
} | tee -a "$REPORT"

# ---------------------------------------------------------------------------------------------
# (d) expert parallelism: ep 2 on 2 ranks against one rank; dp 4 x ep 2
MOE_D="--moe-experts 4 --moe-topk 2 --moe-capacity 1.0 --steps $D_STEPS --accuracy 0 --eval-batches 1"
launch d-one 1 $MOE_D
finish
launch d-ep2 2 $MOE_D --ep 2
finish
if [ "$EP4" = 1 ]; then launch d-dp4ep2 4 $MOE_D --ep 2; finish; fi
# ep_lines RUN: "counted formula balanced edp edp_formula" per step (MiB)
ep_lines() {
    sed -n 's/^  ep comm | all-to-all sent *\([0-9.]*\) MiB (formula 2 a C (rows out + rows in) *\([0-9.]*\) MiB, \([a-zA-Z]*\); balanced *\([0-9.]*\) MiB) | edp all-reduce *\([0-9.]*\) MiB (formula *\([0-9.]*\) MiB.*/\1 \2 \3 \4 \5 \6/p' "$OUT/$1.out"
}
{
echo
echo "## (d) Expert parallelism: the all-to-all bytes against the formula"
echo
echo "E 4, top-2, capacity factor 1.0 (so that some pairs drop), batch 32 x 64, $D_STEPS steps. ep 2: mpirun -np 2 --ep 2"
echo "(each rank 16 sequences and 2 of the 4 experts of each MoE block); dp 4 x ep 2: 4 ranks (oversubscribed), edp groups"
echo "{0, 2}, {1, 3}. Tokens per expert: summed over the ranks, against the one-rank run's. All-to-all: MiB rank 0 sent on"
echo "the ep group in the step, counted by llmc/comm; formula: a C x the rows it sent to other ranks in the four exchanges"
echo "(dispatch and return, forward and backward: 2 a C (out + in) per block) from the measured routing; balanced:"
echo "4 a C k B T (ep-1)/ep x 3 blocks (B = the rank's 16 or 8 sequences, nothing dropped). edp: the ring all-reduce of"
echo "the rank's expert gradients over its edp group (none at dp 2 = ep 2)."
echo
echo "| run | step | loss | loss (1 rank) | tokens per expert | the same as 1 rank | all-to-all MiB (formula) | balanced MiB | edp all-reduce MiB (formula) |"
echo "|---|---:|---:|---:|---|---|---:|---:|---:|"
for r in d-ep2 d-dp4ep2; do
    [ "$r" = d-dp4ep2 ] && [ "$EP4" != 1 ] && continue
    if ok "$r" && ok d-one; then
        paste -d'|' <(steps "$r") <(steps d-one) <(ep_lines "$r") | awk -F'|' -v r="${r#d-}" '{
            split($1, a, " "); split($2, b, " "); split($3, c, " ")
            ta = "[" a[3] " " a[4] " " a[5] " " a[6] "]"; tb = "[" b[3] " " b[4] " " b[5] " " b[6] "]"
            printf "| %s | %s | %s | %s | %s | %s | %s (%s, %s) | %s | %s (%s) |\n", r, a[1], a[2], b[2], ta, ta == tb ? "yes" : "NO " tb,
                c[1], c[2], c[3], c[4], c[5], c[6] }'
        n=$(grep -c '^  ep comm | all-to-all' "$OUT/$r.out"); e=$(grep -c '^  ep comm | all-to-all.*MiB, equal; balanced' "$OUT/$r.out")
        echo "| ${r#d-} | | | | | | equal to the formula on $e of $n steps | | |"
    else
        echo "| ${r#d-} | not available: $(why "$r") | | | | | | | |"
    fi
done
} | tee -a "$REPORT"
if ok d-ep2; then
    { echo; echo "ep 2's plan (rank 0):"; echo; echo '```'; grep -A3 '^expert parallel' "$OUT/d-ep2.out"; echo '```'; } | tee -a "$REPORT"
fi

echo
echo "lab time: $(( $(date +%s) - start )) s" | tee -a "$REPORT"
echo "lab_moe: table in $REPORT, CSV in $CSV$([ -s "$PNG" ] && echo ", plot in $PNG"), every run's output in $OUT/"
if [ ${#failed[@]} -gt 0 ]; then
    echo "lab_moe: ${#failed[@]} run(s) failed: ${failed[*]} (outputs in $OUT/)" >&2
    exit 1
fi
