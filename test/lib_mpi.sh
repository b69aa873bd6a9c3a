# What the multi-rank CPU suites share (test_dp.sh, test_tp.sh): source it after setting T (the
# suite's scratch directory) and WHAT (what needs MPI, for the message).
#   pass NAME / fail NAME DETAIL...   one PASS or FAIL line (details indented below a FAIL)
#   MPIRUN                            mpirun as root, oversubscribed, shared memory, a 300 s limit
#   expect_all NAME PATTERN NP CMD... bad input: every rank reports PATTERN, all exit non-zero, no hang
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
