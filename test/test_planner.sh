#!/usr/bin/env bash
# The planner (llmc/planner/) against the trainer, on CPU ranks:
#   - for 16 meshes (dp with ZeRO 0-3, tp with and without SP, pp with gpipe, 1f1b, interleaved
#     and zb-h1, cp ring and all-to-all, ep, recomputation, 3D dp x pp x tp and 4D
#     dp x pp x cp x tp): `--plan this` (one process, no step run) predicts every rank's memory
#     per category and bytes per step per communicator; the run with --plan-check measures them
#     (the data-parallel memory table's allocator counts, the communicators' counted bytes of
#     step 2); the two files must be equal, every rank, every figure;
#   - the comparison can fail: the planner with deliberate bugs (test/perturbations.py: ZeRO-2's gradient
#     row of the memory table, the pipeline's bytes formula) must differ from the measured files
#     (PLANNER_PERTURB=0 skips this part, about a minute);
#   - --mesh auto on 8 ranks, for two model sizes (the second with a memory limit that rules
#     out pure data parallelism): the run completes with the chosen mesh and says why;
#   - bad input: more devices than the model and batch can use, memory too small for any mesh,
#     --mesh auto with a mesh flag: a clear answer, non-zero exit.
set -u
cd "$(dirname "$0")/.."
T=build/planner-test
rm -rf "$T"
mkdir -p "$T"
WHAT="the planner"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail, MPIRUN, expect_all; stops here without MPI

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 2000 --num-val 200 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
# 4 layers (pp 2 x 2 interleaved chunks, pp 4), 4 heads of 16 channels (tp 2, 4; cp all-to-all 2)
MODEL="--layers 4 --heads 4 --channels 64 --batch 8 --seq 32 --steps 2 --lr 1e-3"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"

# mesh NP LABEL FLAGS...: predicted (--plan this) against measured (--plan-check), every rank
n_mesh=0
mesh() {
    local np=$1 label=$2; shift 2
    local bin=./train_gpt2cpu
    # shellcheck disable=SC2086
    $bin $D $MODEL $QUIET "$@" --plan this >"$T/$label.plan" 2>&1 ||
        { fail "$label: --plan this" "$(tail -2 "$T/$label.plan")"; return; }
    grep '^rank ' "$T/$label.plan" >"$T/$label.predicted"
    # shellcheck disable=SC2086
    $MPIRUN -np "$np" $bin $D $MODEL $QUIET "$@" --plan-check "$T/$label.measured" >"$T/$label.out" 2>&1 ||
        { fail "$label: the run" "$(tail -2 "$T/$label.out")"; return; }
    n_mesh=$((n_mesh + 1))
    if [ "$(wc -l <"$T/$label.measured")" -eq "$np" ] && cmp -s "$T/$label.predicted" "$T/$label.measured"; then
        local r0
        r0=$(head -1 "$T/$label.measured" | python3 -c "
import sys; w = sys.stdin.read().replace('|', ' ').split(); d = dict(zip(w[2::2], w[3::2]))
mem = ', '.join(f'{k} {int(d[k]) / 2**20:.3f}' for k in ['params', 'grads', 'optim', 'acts', 'experts'] if int(d[k]))
comm = ', '.join(f'{k} {int(d[k]) / 2**20:.3f}' for k in ['dp', 'tp', 'pp', 'pp-embed', 'cp', 'ep', 'edp'] if int(d[k]))
print(f'rank 0 MiB: {mem} | sent: {comm}')")
        pass "$label ($np ranks): predicted = measured on every rank ($r0)"
    else
        fail "$label ($np ranks): predicted != measured" "$(diff "$T/$label.predicted" "$T/$label.measured" | head -4)"
    fi
}

mesh 4 dp4-ddp           --dp 4
mesh 4 dp4-zero1         --dp 4 --zero 1
mesh 4 dp4-zero2-m2      --dp 4 --zero 2 --grad-accum 2
mesh 4 dp4-zero3         --dp 4 --zero 3
mesh 4 tp4               --tp 4
mesh 4 dp2-tp2-sp-zero1  --dp 2 --tp 2 --sp --zero 1
mesh 2 tp2-recompute     --tp 2 --recompute full
mesh 4 pp4-1f1b          --pp 4 --pp-schedule 1f1b --grad-accum 4
mesh 4 dp2-pp2-gpipe     --dp 2 --pp 2 --pp-schedule gpipe --grad-accum 2 --zero 2
mesh 2 pp2-interleaved   --pp 2 --pp-schedule interleaved --pp-chunks 2 --grad-accum 2
mesh 2 pp2-zb            --pp 2 --pp-schedule zb-h1 --grad-accum 2
mesh 4 dp2-cp2-ring      --dp 2 --cp 2 --zero 1 --recompute selective
mesh 2 cp2-alltoall      --cp 2 --cp-algo alltoall
mesh 4 dp4-ep2           --dp 4 --ep 2 --moe-experts 2 --moe-topk 2
mesh 8 3d-dp2-pp2-tp2    --dp 2 --pp 2 --tp 2 --sp --pp-schedule 1f1b --grad-accum 2 --zero 1
mesh 16 4d-dp2-pp2-cp2-tp2 --dp 2 --pp 2 --cp 2 --tp 2 --grad-accum 2
[ "$n_mesh" -ge 12 ] && pass "$n_mesh meshes compared (at least 12)" || fail "only $n_mesh meshes ran"

# ---- the comparison can fail: a perturbed formula in the planner's build
perturbed_plan() {
    local label=$1 mesh_label=$2; shift 2
    perturbed_build "$label" || return
    # shellcheck disable=SC2086
    "$T/perturbed/train" $D $MODEL $QUIET "$@" --plan this 2>&1 | grep '^rank ' >"$T/p.predicted"
    if cmp -s "$T/p.predicted" "$T/$mesh_label.measured"; then
        fail "perturbation '$label' went unnoticed: the planner still equals the run $mesh_label"
    else
        pass "perturbation '$label' is caught: $(diff "$T/p.predicted" "$T/$mesh_label.measured" | grep -m1 '^<' | cut -c1-110)"
    fi
}
if [ "${PLANNER_PERTURB:-1}" = 1 ]; then
    # the formulas of test/perturbations.py: ZeRO-2's gradient not divided by N; the pipeline's
    # bytes for m - 1 micro-batches
    perturbed_plan "ZeRO-2 keeps the whole gradient" dp4-zero2-m2 --dp 4 --zero 2 --grad-accum 2
    perturbed_plan "the pipeline sends one micro-batch fewer" pp4-1f1b --pp 4 --pp-schedule 1f1b --grad-accum 4
fi

# ---- --mesh auto on 8 ranks, two model sizes
auto() {
    local label=$1; shift
    # shellcheck disable=SC2086
    $MPIRUN -np 8 ./train_gpt2cpu $D $QUIET --steps 2 "$@" --mesh auto >"$T/$label.out" 2>&1
    local rc=$? chose
    chose=$(grep -m1 '^mesh auto' "$T/$label.out" | sed 's/^mesh auto *chose //')
    if [ "$rc" -eq 0 ] && [ -n "$chose" ] && grep -q '^  because' "$T/$label.out" && grep -q '^step *2/2' "$T/$label.out"; then
        pass "--mesh auto, $label: ran 2 steps with $chose ($(grep -m1 '^  because' "$T/$label.out" | sed 's/^  because *//' | cut -c1-90)...)"
    else
        fail "--mesh auto, $label: exit $rc" "$(tail -3 "$T/$label.out")"
    fi
}
auto "tiny model" --model tiny --batch 16 --seq 64
auto "8 layers of C 256, 0.03 GiB per device" --layers 8 --heads 8 --channels 256 --batch 16 --seq 64 --device-mem 0.03
if grep -q '^mesh auto *chose --dp 8 --grad-accum' "$T/8 layers of C 256, 0.03 GiB per device.out"; then
    fail "the memory limit did not rule out pure data parallelism"
else
    pass "with 0.03 GiB per device the choice splits the model: $(grep -m1 '^mesh auto' "$T/8 layers of C 256, 0.03 GiB per device.out" | sed 's/^mesh auto *chose //')"
fi

# ---- bad input
bad_plan() {
    local label=$1 pattern=$2; shift 2
    case "$1" in timeout|./*) ;; *) set -- ./train_gpt2cpu "$@" ;; esac
    "$@" >"$T/bad.out" 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ] && grep -q -- "$pattern" "$T/bad.out"; then
        pass "$label: exit $rc, '$(grep -m1 -- "$pattern" "$T/bad.out" | cut -c1-150)'"
    else
        fail "$label: exit $rc" "$(tail -3 "$T/bad.out")"
    fi
}
bad_plan "more devices than the model can use" "^what would: " --model tiny --batch 4 --seq 32 --plan all --devices 4096
grep -q "^nothing runs" "$T/bad.out" || fail "no 'nothing runs' line for 4096 devices"
# the most devices the flags take, and a count with 240 divisors: the planner enumerates only the meshes
# that can split the model (tp | heads, cp | T, dp | batch, pp <= layers), so it answers at once (it
# ran for minutes when it enumerated every factorisation of the count; the timeout only catches a hang)
bad_plan "a million devices" "^what would: 147456 devices" timeout 60 ./train_gpt2cpu --model gpt2 --batch 32 --seq 64 --plan all --devices 1048576
bad_plan "720720 devices (240 divisors)" "^what would: " timeout 60 ./train_gpt2cpu --model gpt2 --batch 32 --seq 64 --plan all --devices 720720
bad_plan "memory too small for any mesh" "^what would: devices of at least" --model gpt2 --batch 8 --seq 1024 --plan all --devices 8 \
    --device-mem 0.01
grep -q "^nothing fits" "$T/bad.out" || fail "no 'nothing fits' line for 0.01 GiB"
expect_all "--mesh auto with --tp" "--mesh auto chooses" 2 ./train_gpt2cpu $D $QUIET --mesh auto --tp 2
bad_plan "--plan this of a mesh the trainer refuses" "does not divide the 4 attention heads" $D $MODEL --tp 8 --plan this

# ---- a node's one link shared by its devices (--links with "inter ... shared", as collbench -L writes on
# several nodes): on 2 nodes of 2, dp 2 x tp 2 sends two dp flows out of each node at once (groups {0,2}
# {1,3}), so its predicted communication grows; dp 4 sends one flow each way (ranks 0 1 | 2 3), so it does not
printf 'intra 5 2.5\ninter 40 0.25\n' >"$T/links_own.txt"
printf 'intra 5 2.5\ninter 40 0.25 shared\n' >"$T/links_shared.txt"
plan_comm() {   # plan_comm LINKS MESH...: the predicted comm column (ms) of --plan this
    # shellcheck disable=SC2086
    ./train_gpt2cpu $D $MODEL $QUIET --per-node 2 --links "$1" "${@:2}" --plan this 2>&1 |
        awk '/^  1  dp/ { sub(/ +(fits|too big)$/, ""); print $(NF-1) }'
}
a=$(plan_comm "$T/links_own.txt" --dp 2 --tp 2); b=$(plan_comm "$T/links_shared.txt" --dp 2 --tp 2)
c=$(plan_comm "$T/links_own.txt" --dp 4); d=$(plan_comm "$T/links_shared.txt" --dp 4)
if [ -n "$a" ] && [ -n "$c" ] && awk -v a="$a" -v b="$b" -v c="$c" -v d="$d" 'BEGIN { exit !(b > a && c == d) }'; then
    pass "a shared link between nodes: dp 2 x tp 2 comm $a -> $b ms (two flows share it), dp 4 $c -> $d ms (one flow)"
else
    fail "a shared link between nodes" "dp 2 x tp 2: '$a' -> '$b' ms (want more), dp 4: '$c' -> '$d' ms (want equal)"
fi
