#!/usr/bin/env bash
# The multi-rank CUDA trainer under the CPU emulator (dev/emu/): build/emu/train_gpt2cu under
# mpirun, data-parallel modes against the single-rank emulated run, on the host-staged wire
# (every emulated rank shares the one emulated GPU, so llmc/comm moves device buffers through
# host copies over MPI; NCCL cannot run without a GPU). The CPU twin, in fp32, is test_dp.sh.
#
# The trainer is bf16 (parameters, gradients and activations; fp32 master weights and AdamW),
# so a data-parallel run cannot equal one rank bit for bit: each rank rounds its share of the
# gradient to bf16, then the shares are added and averaged (more roundings, in another order).
# What is expected, and judged, per run against one rank (same model, data and global batch):
#   - step 1 loss: within 1e-6 relative. The forward pass runs on the same parameters; only the
#     fp32 mean of the per-rank losses is taken in another order (measured: <= 1e-7);
#   - every step's loss: within 2^-9 (bf16's half unit of rounding, ~2.0e-3) relative;
#   - every step's gradient norm: within 2^-8 (~3.9e-3) relative, one bf16 unit: every
#     element of the averaged gradient carries a few bf16 roundings more or fewer than one
#     rank's, and a norm inherits their size at most. A dropped average (x p) or a missing
#     bucket fails it;
#   - the parameters after the last step, per tensor, norm-wise |a - b|_2 / |a|_2 within 2^-6
#     (~1.6e-2, two bf16 units of 2^-7): a bf16 parameter may land on the other neighbour in
#     stochastic rounding (one unit; the modes that update per layer slice or shard draw other
#     random bits than one rank's whole-tensor update), and the master weights drift by the
#     gradient's rounding-order noise. The key bias is left out (test/compare_runs.py says why).
# The control line runs one rank with the batch split into 4 micro-steps (nothing changes but
# the bf16 rounding order, the same kind of difference data parallelism makes) against the same
# tolerances: its figures are the noise floor the data-parallel figures should resemble.
# Where the arithmetic is order-independent, bit-exactness is judged: on 2 ranks every sum has
# two terms (a + b = b + a in fp32, and the bf16 reduce rounds once), so the collective
# algorithm (ring or native MPI), the bucket count and the communication thread's timing
# cannot change a bit; with ZeRO the shard layout is fixed by the buckets, so ZeRO-1, -2 and -3
# on 3 ranks (1 micro-step) must give identical logs and checkpoints.
# Also per run: the memory table (measured = formula on every rank) and, for our ring and the
# parameter server, every step's counted bytes = formula. And one failing case: a bad flag on
# every rank ends the job with a clear message, a non-zero exit and no hang.
set -u
cd "$(dirname "$0")/.."
T=build/emu-dp-test
BIN=build/emu/train_gpt2cu
rm -rf "$T"
mkdir -p "$T"
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; status=1; }
status=0
start=$(date +%s)

if ! command -v mpirun >/dev/null; then
    echo "FAIL emulated data parallelism needs mpirun and MPI (apt-get install libopenmpi-dev openmpi-bin, then make emu)"
    exit 1
fi
if [ ! -x "$BIN" ] || ! strings "$BIN" | grep -q MPI_Init_thread; then
    echo "FAIL $BIN missing or built without MPI (apt-get install libopenmpi-dev openmpi-bin, then make -B $BIN)"
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 300 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
# 2 layers of C 32: --bucket-mb 0.01 gives 3 buckets (one per block + root); batch 12 splits
# over 1, 2, 3, 4 ranks and 2 or 4 micro-steps
STEPS=3
MODEL="--layers 2 --heads 2 --channels 32 --max-seq 32 --batch 12 --seq 16 --steps $STEPS --lr 1e-3 --warmup 2"
QUIET="--eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 --threads 1"
TRAIN="$BIN $D $MODEL $QUIET"


# the single-rank reference (no mpirun, no data-parallel code involved), and the control
for r in "ref|1" "split|4"; do
    name=${r%%|*}
    $TRAIN --grad-accum "${r#*|}" --log "$T/$name.log" --save "$T/$name.bin" >"$T/$name.out" 2>&1 ||
        { echo "FAIL single-rank emulated run ($name): $(tail -2 "$T/$name.out")"; exit 1; }
done
python3 test/judge_bf16.py "$T/ref" "$T/split" "control, 1 rank, 4 micro-steps vs 1 (bf16 rounding order only)" --step1 1e-6 --params || status=1

# NAME|NP|FLAGS
RUNS=("naive|2|--dp-mode naive"
      "naive, native MPI|2|--dp-mode naive --comm-algo native"
      "ddp, 1 bucket|2|--bucket-mb 10"
      "ddp, 3 buckets, native MPI|2|--bucket-mb 0.01 --comm-algo native"
      "parameter server, 2 servers|2|--dp-mode ps --ps-servers 2"
      "ZeRO-2 + offload, 2 micro-steps|2|--zero 2 --offload --bucket-mb 0.01 --grad-accum 2"
      "ZeRO-1, 3 buckets|3|--zero 1 --bucket-mb 0.01"
      "ZeRO-2, 3 buckets|3|--zero 2 --bucket-mb 0.01"
      "ZeRO-3|3|--zero 3"
      "naive|4|--dp-mode naive"
      "parameter server, 1 server|4|--dp-mode ps --ps-servers 1"
      "ZeRO-3 + hpZ groups of 3|3|--zero 3 --hpz 3"
      "ZeRO-3 + hpZ groups of 1|3|--zero 3 --hpz 1"
      "parameter server, 1 server, layer-wise chunks by priority|4|--dp-mode ps --ps-servers 1 --comm-chunk-kb 2 --comm-order priority")
i=0
for entry in "${RUNS[@]}"; do
    i=$((i + 1))
    name=${entry%%|*}
    rest=${entry#*|}
    np=${rest%%|*}
    flags=${rest#*|}
    tag="np $np, $name"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    if ! $MPIRUN -np "$np" $TRAIN $flags --log "$T/run$i.log" --save "$T/run$i.bin" >"$T/run$i.out" 2>&1 </dev/null; then
        fail "$tag: the run failed" "$(grep -v '^\s*$' "$T/run$i.out" | tail -3)"
        continue
    fi
    python3 test/judge_bf16.py "$T/ref" "$T/run$i" "$tag vs 1 rank ($(($(date +%s) - t0)) s)" --step1 1e-6 --params || status=1
    grep -q "memory check ok" "$T/run$i.out" || fail "$tag: memory table" "$(grep -A8 'memory per rank' "$T/run$i.out")"
    if [[ $flags != *native* ]]; then
        n=$(grep -c "comm | sent .* equal)" "$T/run$i.out")
        [ "$n" -eq "$STEPS" ] || fail "$tag: counted communication = formula in $n of $STEPS steps" "$(grep -m2 'comm |' "$T/run$i.out")"
    fi
done

# bit for bit where the arithmetic does not depend on the order (runs numbered as in RUNS)
same() {   # NAME I J...: run I's log and checkpoint equal each run J's
    local name=$1 first=$2 j bad=""; shift 2
    for j in "$@"; do
        cmp -s "$T/run$first.log" "$T/run$j.log" && cmp -s "$T/run$first.bin" "$T/run$j.bin" || bad="$bad $j"
    done
    if [ -z "$bad" ]; then pass "$name: logs and checkpoints identical bit for bit"; else fail "$name: differ (runs$bad vs $first)"; fi
}
same "np 2, naive: ring = native MPI" 1 2
same "np 2, ddp: 1 bucket ring = 3 buckets native MPI" 3 4
same "np 3: ZeRO-1 = ZeRO-2 = ZeRO-3" 7 8 9
same "np 3: ZeRO-3 = ZeRO-3 + hpZ 3 = ZeRO-3 + hpZ 1 (llmc/parallel/dp_zeropp.h)" 9 12 13
same "np 4: parameter server = its layer-wise chunks by priority (llmc/parallel/dp_priority.h)" 11 14

# ZeRO++ with every option (doc/memory.md, ZeRO++): the GPU kernels of llmc/cuda/quantize.cuh and the
# events that order them before the collectives. Per step, each collective's counted bytes =
# its formula; step 1's loss (same master weights as ZeRO-3) within 6 ||g|| e of ZeRO-3's, where
# e = |dw| (the printed absmax/254) plus bf16's rounding of the dequantised weight, at most
# absmax/512 (2^-9 relative): e = |dw| (1 + 254/512)
t0=$(date +%s)
if $MPIRUN -np 3 $TRAIN --zero 3 --qwz --hpz 3 --qgz 8 --log "$T/zpp.log" >"$T/zpp.out" 2>&1 </dev/null; then
    python3 - "$T/run9.log" "$T/zpp.log" "$T/zpp.out" "$STEPS" "$(($(date +%s) - t0))" <<'EOF2' || status=1
import re, sys
ref, run, out, steps, secs = sys.argv[1:6]
a = [l.split() for l in open(ref)]; b = [l.split() for l in open(run)]
text = open(out).read()
eq = len(re.findall(r"qwZ all-gather sent \d+ B \(formula \d+ B, equal\) \| hpZ group all-gather sent \d+ B \(formula \d+ B, equal\) \| qgZ all-to-all sent \d+ B \(formula \d+ B, equal\)", text))
tot = len(re.findall(r"comm \| sent .* equal\)", text))
dw = float(re.search(r"\|dw\| <= (\S+),", text).group(1))
dL, tol = abs(float(b[0][1]) - float(a[0][1])), 6 * float(a[0][2]) * dw * (1 + 254 / 512)
ok = eq == int(steps) and tot == int(steps) and dL <= tol and "memory check ok" in text
print(f"{'PASS' if ok else 'FAIL'} np 3, ZeRO-3 + qwZ + hpZ 3 + qgZ int8 ({secs} s): bytes = formula in {eq} of {steps} steps "
      f"(total {tot}), step 1 |dL| {dL:.2e} <= {tol:.2e}, final loss {float(b[-1][1]):.6f} vs ZeRO-3 {float(a[-1][1]):.6f}")
sys.exit(0 if ok else 1)
EOF2
else
    fail "np 3, ZeRO-3 + qwZ + hpZ 3 + qgZ int8: the run failed" "$(grep -v '^\s*$' "$T/zpp.out" | tail -3)"
fi

# a bad flag on every rank, found after the device communicator exists: a clear message, a
# non-zero exit, no hang
t0=$(date +%s)
$MPIRUN -np 2 $TRAIN --dp-mode ps --ps-servers 3 >"$T/bad.out" 2>&1 </dev/null
rc=$?
n=$(grep -c "at most the 2 data-parallel ranks" "$T/bad.out")
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -ge 1 ]; then
    pass "bad flag on every rank: exit $rc after $(($(date +%s) - t0)) s, '$(grep -m1 'at most' "$T/bad.out" | sed 's/^error: //')'"
else
    fail "bad flag on every rank" "exit $rc, $n messages" "$(tail -3 "$T/bad.out")"
fi
echo "test_emu_dp: $(($(date +%s) - start)) s"
exit $status
