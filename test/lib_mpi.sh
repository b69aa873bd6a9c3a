# What the multi-rank CPU suites share (test_dp.sh, test_tp.sh): source it after setting T (the
# suite's scratch directory) and WHAT (what needs MPI, for the message).
#   pass NAME / fail NAME DETAIL...   one PASS or FAIL line (details indented below a FAIL)
#   MPIRUN                            mpirun as root, oversubscribed, shared memory, a 300 s limit
#   ref NAME FLAGS...                 a single-rank reference run: $T/NAME.log, .bin, .out (uses
#                                     $D $MODEL $QUIET; exits the suite if it fails)
#   expect_all NAME PATTERN NP CMD... bad input: every rank reports PATTERN, all exit non-zero, no hang
#   run_vs_ref NP REF LABEL FLAGS...  NP ranks with $D $MODEL $QUIET FLAGS into $T/run.{out,log,bin}, compared
#                                     with $T/REF (test/compare_runs.py); returns 1 (after a FAIL) when the run fails
#   perturbed_build NAME              $T/perturbed/train: the trainer with the deliberate bug NAME of
#                                     test/perturbations.py switched on
#   perturb NAME REF ARGS...          that trainer, run on 2 ranks (PERTURB_NP=N: N) with ARGS, must FAIL
#                                     the equivalence check against $T/REF.log and $T/REF.bin
# Exits with one FAIL line when mpirun or the MPI build of train_gpt2cpu is missing.
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; }

if ! command -v mpirun >/dev/null || ! strings ./train_gpt2cpu | grep -q MPI_Init_thread; then
    echo "FAIL $WHAT needs mpirun and the MPI build (apt-get install libopenmpi-dev openmpi-bin; make)"
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 300 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"

expect_all() {
    local name=$1 pattern=$2 np=$3; shift 3
    $MPIRUN -np "$np" "$@" >"$T/bad.out" 2>&1
    local rc=$? n
    n=$(grep -c -- "$pattern" "$T/bad.out")
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -ge 1 ]; then
        pass "$name: exit $rc, '$(grep -m1 -- "$pattern" "$T/bad.out" | sed 's/^error: //')'"
    else
        fail "$name" "exit $rc, $n messages" "$(tail -3 "$T/bad.out")"
    fi
}

run_vs_ref() {
    local np=$1 refname=$2 label=$3; shift 3
    rm -f "$T/run.log" "$T/run.bin"
    # shellcheck disable=SC2086
    if ! $MPIRUN -np "$np" ./train_gpt2cpu $D $MODEL $QUIET "$@" --log "$T/run.log" --save "$T/run.bin" >"$T/run.out" 2>&1; then
        fail "$label: the run failed" "$(grep -v '^\s*$' "$T/run.out" | grep -v -- '---' | tail -3)"
        return 1
    fi
    python3 test/compare_runs.py "$T/$refname.log" "$T/$refname.bin" "$T/run.log" "$T/run.bin" --label "$label matches 1 rank"
}

# perturbed_build NAME: $T/perturbed/train, the trainer with the deliberate bug NAME of
# test/perturbations.py switched on (build/perturbed/train_gpt2cpu, which make test builds once
# with every bug in it, run with LLMC_PERTURB=NAME); returns 1 (after a FAIL line) when that
# build is missing or NAME's text was not found in the sources
PERTURBED_BIN=build/perturbed/train_gpt2cpu
perturbed_build() {
    local label=$1 dir="$T/perturbed"
    if [ ! -x "$PERTURBED_BIN" ]; then
        fail "perturbation '$label': $PERTURBED_BIN is not built (make $PERTURBED_BIN)"; return 1
    fi
    if grep -q -F -- "$label: " build/perturbed/src/missing.txt; then
        fail "perturbation '$label': $(grep -F -- "$label: " build/perturbed/src/missing.txt | head -1 | cut -c1-160)"; return 1
    fi
    if ! grep -q -F -- "    \"$label\"," build/perturbed/src/perturb.h; then
        fail "perturbation '$label' is not in test/perturbations.py"; return 1
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    printf '#!/bin/sh\nLLMC_PERTURB='"'%s'"' exec %s "$@"\n' "$label" "$PWD/$PERTURBED_BIN" >"$dir/train"
    chmod +x "$dir/train"
}

perturb() {
    local label=$1 ref=$2 dir="$T/perturbed"
    shift 2
    perturbed_build "$label" || return
    rm -f "$T/p.log" "$T/p.bin"
    $MPIRUN -np "${PERTURB_NP:-2}" "$dir/train" "$@" --log "$T/p.log" --save "$T/p.bin" >"$T/p.out" 2>&1
    if python3 test/compare_runs.py "$T/$ref.log" "$T/$ref.bin" "$T/p.log" "$T/p.bin" --label x >"$T/p.cmp" 2>&1; then
        fail "perturbation '$label' went unnoticed" "$(cat "$T/p.cmp")"
    else
        pass "perturbation '$label' fails the equivalence: $(sed 's/^FAIL x[: ]*//' "$T/p.cmp" | head -1 | cut -c1-110)"
    fi
}

ref() {
    local name=$1; shift
    # shellcheck disable=SC2086
    ./train_gpt2cpu $D $MODEL $QUIET "$@" --log "$T/$name.log" --save "$T/$name.bin" >"$T/$name.out" 2>&1 ||
        { echo "FAIL single-rank reference $name: $(tail -2 "$T/$name.out")"; exit 1; }
}
