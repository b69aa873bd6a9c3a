#!/usr/bin/env bash
# Runs every test of the project and counts the PASS/FAIL lines they print.
# The last line is "N passed, M failed"; the exit status is 0 only when M is 0.
# Each suite's full output is kept in build/test-logs/.
set -u
cd "$(dirname "$0")/.."
mkdir -p build/test-logs
passed=0
failed=0

# run NAME CMD...: run a suite, echo its PASS/FAIL lines, count them. A suite that exits
# non-zero without printing a FAIL line (a crash, a missing prerequisite) counts as one failure.
run() {
    local name=$1; shift
    local log=build/test-logs/$name.log
    echo "== $name: $*"
    "$@" >"$log" 2>&1
    local rc=$?
    local p f
    p=$(grep -c '^PASS ' "$log")
    f=$(grep -c '^FAIL ' "$log")
    grep -E '^(PASS|FAIL) ' "$log" | sed 's/^/   /'
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "   FAIL $name exited with status $rc:"
        tail -5 "$log" | sed 's/^/      /'
        f=1
    elif [ "$f" -gt 0 ]; then
        echo "   (details in $log)"
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}

run kernels ./test_kernelscpu
run reference bash test/test_reference.sh
run trainer bash test/test_trainer.sh
run data python3 test/test_data.py
run collectives bash test/test_collectives.sh
run collbench bash test/test_collbench.sh
run data-parallel bash test/test_dp.sh
run generate ./test_generatecpu
run sft-data bash test/test_sft.sh
run tasks bash test/test_tasks.sh
NVCC=$(command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
if [ -n "$NVCC" ]; then
    run nvcc bash scripts/nvcc_check.sh "$NVCC"
else
    echo "== nvcc: skipped, nvcc not found (install the CUDA toolkit to compile the .cu files with it)"
fi

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
