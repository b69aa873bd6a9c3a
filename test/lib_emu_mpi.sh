# What the emulated multi-rank trainer suites share (test_emu_tp.sh, test_emu_pp.sh): source it
# after setting T (the suite's scratch directory) and WHAT (what needs MPI, for the message).
#   EMU                         where the MPI trainers are (build/emu, or $EMU_BIN_DIR: point it at
#                               trainers built for a GPU to run a suite's runs on one)
#   pass NAME / fail NAME DETAIL...   one PASS or FAIL line; fail sets status=1
#   MPIRUN                      mpirun as root, oversubscribed, shared memory, a 300 s limit
#   D                           the flags of a fresh arithmetic dataset in $T/data
# Makes $T afresh; exits with one FAIL line when mpirun or an MPI build of the trainers is missing.
EMU=${EMU_BIN_DIR:-build/emu}
rm -rf "$T"
mkdir -p "$T"
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; status=1; }
status=0

if ! command -v mpirun >/dev/null; then
    echo "FAIL $WHAT needs mpirun and MPI (apt-get install libopenmpi-dev openmpi-bin, then make emu)"
    exit 1
fi
for b in $EMU/train_gpt2cu $EMU/train_gpt2cu_fp32; do
    if [ ! -x "$b" ] || ! strings "$b" | grep -q MPI_Init_thread; then
        echo "FAIL $b missing or built without MPI (make $EMU/train_gpt2cu $EMU/train_gpt2cu_fp32)"
        exit 1
    fi
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 300 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"

# emu_refs [FLAGS...]: the single-rank emulated references, bf16 and fp32, $T/<binary>-ref.*
# (exits the suite when one fails)
emu_refs() {
    local b name
    for b in train_gpt2cu train_gpt2cu_fp32; do
        name=$b-ref
        # shellcheck disable=SC2086
        $EMU/$b $D $MODEL $QUIET "$@" --log "$T/$name.log" --save "$T/$name.bin" >"$T/$name.out" 2>&1 ||
            { echo "FAIL single-rank emulated run ($name): $(tail -2 "$T/$name.out")"; exit 1; }
    done
}

# emu_run I "BINARY|NP|NAME|FLAGS": run I of a suite's table under mpirun ($MODEL $QUIET and the
# entry's flags; log, checkpoint and output at $T/runI.*) and judge it against the single-rank
# run of the same binary ($T/BINARY-ref.*): bf16 with test/judge_bf16.py, fp32 with
# test/compare_runs.py (1e-5). Sets tag, np, flags for the suite's own checks of $T/runI.out.
# Returns 1 (after a FAIL line) when the run itself failed.
emu_run() {
    local i=$1 bin name t0
    IFS='|' read -r bin np name flags <<<"$2"
    tag="np $np, $name"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    if ! $MPIRUN -np "$np" $EMU/$bin $D $MODEL $QUIET $flags --log "$T/run$i.log" --save "$T/run$i.bin" >"$T/run$i.out" 2>&1 </dev/null; then
        fail "$tag: the run failed" "$(grep -v '^\s*$' "$T/run$i.out" | grep -v -- '---' | tail -3)"
        return 1
    fi
    if [ "$bin" = train_gpt2cu ]; then
        python3 test/judge_bf16.py "$T/$bin-ref" "$T/run$i" "$tag vs 1 rank ($(($(date +%s) - t0)) s)" || status=1
    else
        python3 test/compare_runs.py "$T/$bin-ref.log" "$T/$bin-ref.bin" "$T/run$i.log" "$T/run$i.bin" --label "$tag vs 1 rank" || status=1
    fi
    return 0
}
