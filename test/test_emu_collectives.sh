#!/usr/bin/env bash
# The device path of llmc/comm/ under the CPU emulator (dev/emu/): test_collectives_device on
# 2, 3 and 4 ranks. Every emulated rank shares the one emulated GPU, so comm_enable_device
# picks the host-staged MPI wire (device -> host copy, MPI, host -> device; the local reduce
# and the average as CUDA kernels on the emulated device). Judged bit for bit: exact integer
# sums against the host, and random fp32/bf16/int32 values against the same collective on
# host buffers (MPI itself for the native ones). NCCL cannot run without a GPU: the NCCL pass
# prints a SKIP line, which is neither PASS nor FAIL.
set -u
cd "$(dirname "$0")/.."
BIN=build/emu/test_collectives_device
if ! command -v mpirun >/dev/null; then
    echo "FAIL the emulated device collectives need mpirun and MPI (apt-get install libopenmpi-dev openmpi-bin, then make emu)"
    exit 1
fi
if [ ! -x "$BIN" ]; then
    echo "FAIL $BIN missing: it is built only when MPI is found (apt-get install libopenmpi-dev openmpi-bin, then make $BIN)"
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 300 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
status=0
for np in 2 3 4; do
    out=$($MPIRUN -np "$np" "$BIN" 2>&1 </dev/null)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL|SKIP) '
    if [ "$rc" -ne 0 ]; then
        status=1
        if ! echo "$out" | grep -q '^FAIL '; then
            echo "FAIL test_collectives_device on $np ranks exited with status $rc:"
            echo "$out" | tail -5 | sed 's/^/     /'
        fi
    fi
done
exit $status
