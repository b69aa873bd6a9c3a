#!/usr/bin/env bash
# The CUDA kernels under the CPU emulator (dev/emu/README.md):
#   1. the emulator's own checks (dev/emu/test_emu.cu), plain and with AddressSanitizer;
#   2. every llmc/cuda kernel against llmc/cpu (test/test_cuda_kernels.cu) in the three thread
#      orders (a missing __syncthreads fails in at least one), the fp32 build, and the
#      AddressSanitizer build (an out-of-bounds access is reported);
#   3. the extension points (test/test_seams.cu: ops, chained placement hooks, the step, the
#      shard rule) on the bf16 CUDA build.
# Each binary's PASS/FAIL lines are printed with the run in brackets after the verdict:
#   PASS [reverse] layernorm_backward B=3 T=101 C=100: ...
# A binary that stops without printing a FAIL line (a deadlock report, an ASan report, a
# crash) gets one FAIL line with the end of its output. Exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/.."
E=build/emu
status=0

# check LABEL ENV... -- CMD...: runs CMD with the environment ENV, relabels its verdict lines
check() {
    local label=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    if [ ! -x "$1" ]; then
        echo "FAIL [$label] $1 is missing: build it with make emu (needs the CUDA toolkit's headers)"
        status=1
        return
    fi
    local out rc
    out=$(env "${envs[@]}" "$@" 2>&1 </dev/null)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL) ' | sed -E "s/^(PASS|FAIL) /\1 [$label] /"
    if [ "$rc" -ne 0 ]; then
        status=1
        if ! echo "$out" | grep -q '^FAIL '; then
            echo "FAIL [$label] $* exited with status $rc:"
            echo "$out" | tail -8 | sed 's/^/      /'
        fi
    fi
}

check emulator -- "$E/test_emu"
check emulator+asan -- "$E/test_emu_asan"
for order in forward reverse random; do
    check "$order" CUDAEMU_ORDER=$order -- "$E/test_cuda_kernels"
done
check fp32 CUDAEMU_ORDER=random -- "$E/test_cuda_kernels_fp32"
check asan CUDAEMU_ORDER=reverse -- "$E/test_cuda_kernels_asan"
check seams -- "$E/test_seams"
exit $status
