#!/usr/bin/env bash
# Lab: the lecture's placement rules measured on a cluster made on this machine (doc/cluster.md).
# 2 nodes x 2 ranks (scripts/cluster.sh: network namespaces; shared memory inside a node, TCP
# between nodes through a link limited to INTER_MBIT each way, about 10x slower than inside).
#   Part 0: the two links, measured by collbench's ping-pongs (rank 0 <-> 1 inside node 0, rank
#           0 <-> 2 across), written as the planner's --links file.
#   Part a: all-reduce across the nodes: the flat ring, the hierarchical all-reduce (reduce-scatter
#           inside / all-reduce across / all-gather inside) and the lecture's drawing of it
#           (reduce to a leader / all-reduce among the leaders / broadcast), from 4 KiB to 16 MiB,
#           each beside its alpha-beta formula with the two measured links.
#   Part b: one 4-rank training job placed several ways: tp 2 inside the node x dp 2 across, tp 2
#           across x dp 2 inside (mpirun --map-by node), pp 2 across x dp 2 inside, pp 2 inside x
#           dp 2 across, dp 4; the step time, the bytes that crossed the slow link per step (the
#           kernel's counters of the nodes' links: what really went over the wire, TCP headers
#           included), and the same job on one machine (shared memory only): the difference is
#           what the slow link costs that placement (the 4 ranks share 2 cores either way).
#   Part c: ZeRO-3 on dp 4 without and with hpZ (--hpz 2: the secondary weight partition inside
#           each node): bytes across the slow link and step time.
#   Part d: the planner, given the two measured links (--links) and the machine's measured
#           compute (one rank, as in lab_plan.sh), predicts each mesh's step; its ranking beside
#           the measured one.
# Bytes per step are the difference between a run of STEPS steps and one of 2, over STEPS - 2 steps
# (the start-up's traffic cancels). Times on 2 shared cores are noisy (4 ranks share them, and
# whatever else runs on the machine): each step time is the fastest of REPEAT runs, alternating
# the cluster and one machine; run the lab twice to see how much they move.
# Needs root (the namespaces) and mpirun. About 3 minutes on 2 cores. Tables to stdout and to
# $OUT/lab_cluster.md, a plot of part a to $OUT/lab_cluster.png (matplotlib, if present).
# Knobs (environment): INTER_MBIT (2000), STEPS (8), REPEAT (3), MODEL, OUT (build/lab-cluster).
#   sudo bash scripts/lab_cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
INTER_MBIT=${INTER_MBIT:-2000}
STEPS=${STEPS:-8}
REPEAT=${REPEAT:-3}
MODEL=${MODEL:-"--layers 8 --heads 4 --channels 128 --batch 8 --seq 64"}
OUT=${OUT:-build/lab-cluster}
NAME=llmclab SUBNET=10.213.80
HOSTS=build/cluster-$NAME/hosts
mkdir -p "$OUT"
command -v mpirun >/dev/null || { echo "lab_cluster: needs mpirun (apt-get install libopenmpi-dev openmpi-bin; make)"; exit 1; }
for b in train_gpt2cpu collbenchcpu; do [ -x "./$b" ] || make "$b"; done
REPORT="$OUT/lab_cluster.md"

scripts/cluster.sh down --name $NAME >/dev/null 2>&1 || true
trap 'scripts/cluster.sh down --name $NAME >/dev/null 2>&1' EXIT
scripts/cluster.sh up --name $NAME --subnet $SUBNET --nodes 2 --ranks-per-node 2 --inter-mbit "$INTER_MBIT" >"$OUT/up.out" 2>&1 ||
    { echo "lab_cluster: scripts/cluster.sh up failed:"; cat "$OUT/up.out"; exit 1; }
LAUNCH="scripts/launch.sh --hostfile $HOSTS"

[ -f "$OUT/data/tokenizer.bin" ] ||
    python3 dev/data/arithmetic.py --out-dir "$OUT/data" --num-train 2000 --num-val 200 >/dev/null
D="--train-data $OUT/data/train_*.bin --val-data $OUT/data/val_*.bin --tokenizer $OUT/data/tokenizer.bin"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"

# bytes that entered the nodes through their links so far (the bridge's ports: every byte that
# crosses from one node to another enters the other node once)
wire_bytes() { local k s=0; for k in 0 1; do s=$((s + $(cat "/sys/class/net/$NAME-$k/statistics/tx_bytes"))); done; echo $s; }
avg_ms() { sed -n 's/^average step (excluding the first): \([0-9.]*\) ms.*/\1/p' "$OUT/$1.out"; }

# ---- Part 0: the links
$LAUNCH --np 4 -- ./collbenchcpu -p allreduce -a ring -b 8 -e 8 -n 2 -R 1 -L "$OUT/links.txt" >"$OUT/links.out" 2>&1 ||
    { echo "lab_cluster: collbench failed:"; tail -5 "$OUT/links.out"; exit 1; }
read -r _ A_IN G_IN _ <<<"$(grep '^intra ' "$OUT/links.txt")"
read -r _ A_X G_X _ <<<"$(grep '^inter ' "$OUT/links.txt")"
{
echo "# Lab: placement on 2 nodes x 2 ranks (scripts/cluster.sh, inter-node link $INTER_MBIT Mbit/s each way)"
echo
echo "## Part 0: the links (collbench ping-pong, written to $OUT/links.txt for the planner)"
echo
echo "| link | alpha (us) | bandwidth 1/beta (GB/s) |"
echo "|---|---:|---:|"
echo "| inside a node (shared memory) | $A_IN | $G_IN |"
echo "| between nodes (TCP, rate-limited) | $A_X | $G_X |"
echo
echo "The link between nodes is $(awk -v a="$G_IN" -v b="$G_X" 'BEGIN { printf "%.1f", a / b }')x slower in bandwidth and $(awk -v a="$A_IN" -v b="$A_X" 'BEGIN { printf "%.0f", b / a }')x in latency."
} | tee "$REPORT"

# ---- Part a: all-reduce across the nodes
$LAUNCH --np 4 -- ./collbenchcpu -p allreduce -a ring,hierarchical,hierarchical_leader -b 4K -e 16M -f 4 -n 5 -R 2 >"$OUT/allreduce.out" 2>&1 ||
    { echo "lab_cluster: collbench failed:"; tail -5 "$OUT/allreduce.out"; exit 1; }
{
echo
echo "## Part a: all-reduce on 2 nodes x 2 ranks: measured (us) and the two-link formula (us)"
echo
echo "| size | native (MPI) | ring | formula | hierarchical | formula | leaders | formula | fastest |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|"
awk '$1 ~ /^[0-9]+$/ && NF >= 12 { t[$1 "," $6] = $7; m[$1 "," $6] = $11; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
     END { for (i = 1; i <= n; i++) { s = order[i]; best = ""; bt = 1e30
             split("native ring hierarchical hierarchical_leader", a, " ")
             for (j = 1; j <= 4; j++) if ((s "," a[j]) in t && t[s "," a[j]] < bt) { bt = t[s "," a[j]]; best = a[j] }
             printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s, t[s ",native"], t[s ",ring"], m[s ",ring"],
                 t[s ",hierarchical"], m[s ",hierarchical"], t[s ",hierarchical_leader"], m[s ",hierarchical_leader"], best } }' "$OUT/allreduce.out"
} | tee -a "$REPORT"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    /usr/bin/python3 - "$OUT/allreduce.out" "$OUT/lab_cluster.png" "$INTER_MBIT" <<'EOF' || true
import sys, collections
import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
t, m = collections.defaultdict(dict), collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 12 or not f[0].isdigit(): continue
    t[f[5]][int(f[0])] = float(f[6])
    if f[10] != "-": m[f[5]][int(f[0])] = float(f[10])
fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.3))
ring = t["ring"]
for i, name in enumerate(["native", "ring", "hierarchical", "hierarchical_leader"]):
    if name not in t: continue
    xs = sorted(t[name]); c = "C%d" % i
    ax.plot(xs, [t[name][x] for x in xs], "o-", color=c, label=name)
    if m[name]: ax.plot(xs, [m[name][x] for x in xs], "--", color=c, alpha=0.6)
    bx.plot(xs, [t[name][x] / ring[x] for x in xs], "o-", color=c, label=name + " (measured)")
    if m[name]: bx.plot(xs, [m[name][x] / m["ring"][x] for x in xs], "--", color=c, alpha=0.6, label=name + " (formula)")
for a in (ax, bx):
    a.set_xscale("log", base=2); a.set_xlabel("all-reduce size (bytes)"); a.grid(True, which="both", alpha=0.3)
ax.set_yscale("log"); ax.set_ylabel("time (us); dashed: the two-link formula")
bx.set_ylabel("time / the flat ring's time"); bx.axhline(1.0, color="gray", lw=0.8)
ax.set_title("All-reduce, 2 nodes x 2 ranks, %s Mbit/s between" % sys.argv[3], fontsize=10)
bx.set_title("against the flat ring (below 1: faster)", fontsize=10)
ax.legend(fontsize=8); bx.legend(fontsize=7)
fig.tight_layout(); fig.savefig(sys.argv[2], dpi=110)
EOF
fi

# ---- Parts b and c: training jobs placed different ways
# job NAME LAUNCH-ARGS -- TRAINER-FLAGS: the run of STEPS steps and one of 2; sets the row
job() {
    local name=$1; shift
    local largs=()
    while [ "$1" != "--" ]; do largs+=("$1"); shift; done
    shift
    local b0 b1 b2 i t
    b0=$(wire_bytes)
    # shellcheck disable=SC2086
    $LAUNCH --np 4 "${largs[@]}" -- ./train_gpt2cpu $D $MODEL $QUIET --steps 2 "$@" >"$OUT/$name.short.out" 2>&1 ||
        { echo "lab_cluster: run $name failed:"; tail -5 "$OUT/$name.short.out"; exit 1; }
    b1=$(wire_bytes)
    STEP="" LOCAL=""
    for ((i = 1; i <= REPEAT; i++)); do
        # shellcheck disable=SC2086
        $LAUNCH --np 4 "${largs[@]}" -- ./train_gpt2cpu $D $MODEL $QUIET --steps "$STEPS" "$@" >"$OUT/$name.out" 2>&1 ||
            { echo "lab_cluster: run $name failed:"; tail -5 "$OUT/$name.out"; exit 1; }
        [ "$i" != 1 ] || b2=$(wire_bytes)
        t=$(avg_ms "$name"); STEP=$(min "$STEP" "$t")
        # the same job on one machine, shared memory only: what the step costs without the slow link
        # shellcheck disable=SC2086
        scripts/launch.sh --np 4 --mpi-args "--mca btl self,vader --mca mpi_yield_when_idle 1" -- \
            ./train_gpt2cpu $D $MODEL $QUIET --steps "$STEPS" "$@" >"$OUT/$name.local.out" 2>&1 ||
            { echo "lab_cluster: run $name on one machine failed:"; tail -5 "$OUT/$name.local.out"; exit 1; }
        t=$(avg_ms "$name.local"); LOCAL=$(min "$LOCAL" "$t")
    done
    ACROSS=$(awk -v a="$((b2 - b1))" -v b="$((b1 - b0))" -v s="$STEPS" 'BEGIN { printf "%.2f", (a - b) / (s - 2) / 1048576 }')
    PLACE=$(sed -n 's/^placement    //p' "$OUT/$name.out")
}
min() { if [ -z "$1" ]; then echo "$2"; else awk -v a="$1" -v b="$2" 'BEGIN { print (b < a ? b : a) }'; fi; }
{
echo
echo "## Part b: one job, placed five ways ($MODEL, $STEPS steps; the average step excludes the first, the fastest of $REPEAT runs)"
echo
echo "| mesh | where the groups are | MiB across the slow link / step | step ms | on one machine | the slow link costs |"
echo "|---|---|---:|---:|---:|---:|"
} | tee -a "$REPORT"
declare -A MEAS
row() {
    MEAS[$1]=$STEP
    echo "| $2 | $PLACE | $ACROSS | $STEP | $LOCAL | $(awk -v a="$STEP" -v b="$LOCAL" 'BEGIN { printf "%+.1f ms", a - b }') |" | tee -a "$REPORT"
}
job tp_in -- --tp 2;                                row tp_in "tp 2 x dp 2 (ranks 0 1 | 2 3)"
job tp_x --mpi-args "--map-by node" -- --tp 2;     row tp_x "tp 2 x dp 2, --map-by node (ranks 0 2 | 1 3)"
job pp_x --mpi-args "--map-by node" -- --pp 2 --grad-accum 4;  row pp_x "pp 2 x dp 2 (1f1b, m 4), --map-by node"
job pp_in -- --pp 2 --grad-accum 4;                row pp_in "pp 2 x dp 2 (1f1b, m 4)"
job dp4 -- ;                                       row dp4 "dp 4 (ring all-reduce)"
{
echo
echo "## Part c: ZeRO-3 on dp 4, without and with hpZ (a secondary copy of the weights sharded inside each node)"
echo
echo "| mesh | where the groups are | MiB across the slow link / step | step ms | on one machine | the slow link costs |"
echo "|---|---|---:|---:|---:|---:|"
} | tee -a "$REPORT"
job z3 -- --zero 3;             row z3 "dp 4, ZeRO-3"
job z3hpz -- --zero 3 --hpz 2;  row z3hpz "dp 4, ZeRO-3 + hpZ 2"

# ---- Part d: the planner with the measured links
# shellcheck disable=SC2086
./train_gpt2cpu $D $MODEL $QUIET --steps "$STEPS" >"$OUT/calibrate.out" 2>&1 ||
    { echo "lab_cluster: the calibration run failed:"; tail -5 "$OUT/calibrate.out"; exit 1; }
GFLOPS=$(sed -n 's/^average step.*| \([0-9.]*\) GFLOP\/s.*/\1/p' "$OUT/calibrate.out")
PLAN="--machine cpu --peak-tflops $(awk -v g="$GFLOPS" 'BEGIN { printf "%.5f", g / 1000 }') --efficiency 1 --per-node 2 --links $OUT/links.txt"
predict() {   # predict NAME FLAGS...: the planner's step ms for this mesh (--plan this)
    local name=$1; shift
    # shellcheck disable=SC2086
    ./train_gpt2cpu $D $MODEL $QUIET $PLAN "$@" --plan this >"$OUT/$name.plan" 2>&1 ||
        { echo "lab_cluster: --plan this for $name failed:"; tail -3 "$OUT/$name.plan"; exit 1; }
    awk '/^  1  dp/ { sub(/ +(fits|too big)$/, ""); print $NF }' "$OUT/$name.plan"
}
{
echo
echo "## Part d: the planner (--links $OUT/links.txt, --per-node 2, compute calibrated on one rank: $GFLOPS GFLOP/s) against the runs"
echo
echo "| mesh | predicted step ms | measured step ms | predicted rank | measured rank |"
echo "|---|---:|---:|---:|---:|"
} | tee -a "$REPORT"
declare -A PRED
PRED[tp_in]=$(predict tp_in --dp 2 --tp 2)
PRED[pp_in]=$(predict pp_in --dp 2 --pp 2 --grad-accum 4)
PRED[dp4]=$(predict dp4 --dp 4)
PRED[z3]=$(predict z3 --dp 4 --zero 3)
names=(tp_in pp_in dp4 z3)
rank_of() {   # rank_of NAME ARRAY: 1 + how many of names are smaller in ARRAY
    local -n arr=$2
    local n r=1
    for n in "${names[@]}"; do awk -v a="${arr[$n]}" -v b="${arr[$1]}" 'BEGIN { exit !(a < b) }' && r=$((r + 1)); done
    echo $r
}
for n in "${names[@]}"; do
    case $n in tp_in) label="tp 2 x dp 2" ;; pp_in) label="pp 2 x dp 2 (1f1b, m 4)" ;; dp4) label="dp 4" ;; z3) label="dp 4, ZeRO-3" ;; esac
    echo "| $label | ${PRED[$n]} | ${MEAS[$n]} | $(rank_of "$n" PRED) | $(rank_of "$n" MEAS) |" | tee -a "$REPORT"
done
echo | tee -a "$REPORT"
echo "(the planner places tp inside a node and dp across, as the trainer's rank order does; the --map-by node placements of part b are not meshes it proposes)" | tee -a "$REPORT"
echo "lab_cluster: tables in $REPORT, every run's output in $OUT/"
