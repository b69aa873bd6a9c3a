#!/usr/bin/env bash
# The context-parallel attention op (llmc/parallel/cp.h) alone, against the single-rank attention:
# test_cp_attentioncpu under mpirun with cp = np = 2, 3, 4 (every algorithm, both splits, odd
# segment lengths; outputs, input gradients, bytes, work per rank). It prints one PASS/FAIL line
# per check; a run that crashes, hangs or exits non-zero without a FAIL line prints one here.
set -u
cd "$(dirname "$0")/.."
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
WHAT="the context-parallel attention test"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh
if [ ! -x ./test_cp_attentioncpu ]; then
    echo "FAIL test_cp_attentioncpu is not built (make test_cp_attentioncpu needs mpicxx)"
    exit 1
fi
# one OpenMP thread per rank: up to 4 ranks share the machine's cores, and OpenMP threads that
# spin in the many small parallel regions beside other ranks make a 0.5 s run take 10 s
export OMP_NUM_THREADS=1
status=0
for np in 2 3 4; do
    $MPIRUN -np $np ./test_cp_attentioncpu >"$T/out" 2>&1
    rc=$?
    cat "$T/out"
    if [ $rc -eq 124 ]; then fail "cp attention np=$np: timed out"; status=1
    elif [ $rc -ne 0 ]; then
        grep -q '^FAIL ' "$T/out" || fail "cp attention np=$np: exit status $rc" "$(tail -3 "$T/out")"
        status=1
    fi
done
exit $status
