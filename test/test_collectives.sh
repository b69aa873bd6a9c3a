#!/usr/bin/env bash
# The collectives (llmc/comm/) under mpirun for p in 1 2 3 4 5 8: every algorithm against the
# native MPI collective, bit for bit, and its counted bytes against its formula
# (test/test_collectives.cu prints one PASS/FAIL line per group and p). Then bad calls: each
# must end the job with a one-line error naming the call, the rank and the reason, never hang.
set -u
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null; then
    echo "skipping the collectives: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    exit 0
fi
if [ ! -x ./test_collectivescpu ]; then
    echo "FAIL test_collectivescpu is not built (make test_collectivescpu needs mpicxx)"
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shared memory only, and ranks that wait yield the core: the machine may have fewer cores than ranks
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
status=0
for p in 1 2 3 4 5 8; do
    timeout 300 $MPIRUN -np $p ./test_collectivescpu   # p=8 takes 15 s on 2 idle cores, minutes on a busy machine
    rc=$?
    if [ $rc -eq 124 ]; then echo "FAIL collectives p=$p: timed out"; status=1
    elif [ $rc -ne 0 ]; then echo "FAIL collectives p=$p: exit status $rc"; status=1; fi
done

# expect_error NAME PATTERN ARGS...: the run must fail and print PATTERN on stderr
expect_error() {
    local name=$1 pattern=$2; shift 2
    local err
    err=$(timeout 60 $MPIRUN -np 2 ./test_collectivescpu "$@" 2>&1 >/dev/null)
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pattern" <<<"$err"; then
        echo "PASS $name: $(grep -m1 -- "$pattern" <<<"$err")"
    else
        echo "FAIL $name: exit status $rc, wanted '$pattern' in: $(head -3 <<<"$err")"
        status=1
    fi
}
expect_error "bad root" "error: broadcast_tree on rank [01] of communicator 'world' (size 2): root 2 out of range \[0, 2)" --bad root
expect_error "mismatched counts" "error: allreduce_ring on rank [01] of communicator 'world' (size 2): ranks disagree on the count" --bad count
expect_error "too many servers" "error: allreduce_parameter_server on rank [01] of communicator 'world' (size 2): 3 servers, want 1 to 2" --bad servers
expect_error "node size not dividing p" "error: allreduce_hierarchical on rank [01] of communicator 'world' (size 2): node size 3 does not divide the 2 ranks" --bad node
expect_error "leader node size not dividing p" "error: allreduce_hierarchical_leader on rank [01] of communicator 'world' (size 2): node size 3 does not divide the 2 ranks" --bad "leader node"
expect_error "torus grid mismatch" "error: allreduce_torus2d on rank [01] of communicator 'world' (size 2): a 2 x 2 grid needs 4 ranks, the communicator has 2" --bad grid
expect_error "alltoallv count mismatch" "error: alltoallv_pairwise on rank 1 of communicator 'world' (size 2): rank 0 sends 2 elements to this rank, which expects 3" --bad alltoallv
exit $status
