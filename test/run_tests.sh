#!/usr/bin/env bash
# Runs the tests and counts the PASS/FAIL lines they print (make test, make test-fast).
#   bash test/run_tests.sh            every suite
#   bash test/run_tests.sh --fast     the fast tier: a few minutes, for the edit loop
#   bash test/run_tests.sh NAME...    the named suites only
# The suites run in two lanes side by side (LANES=1: all in one lane). Each suite's full
# output goes to build/test-logs/NAME.log; its PASS/FAIL lines are printed in the order of
# the table below, each suite as soon as it and the ones above it are done.
# The last line is "N passed, M failed"; the exit status is 0 only when M is 0. A suite that
# exits non-zero without printing a FAIL line (a crash, a missing prerequisite) counts as one
# failure.
set -u
cd "$(dirname "$0")/.."
LOGS=build/test-logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
# The suites' MPI jobs run on this one machine and talk through shared memory (the ob1 PML over
# the vader BTL, which is what Open MPI ends up with here anyway). Said up front, it skips probing
# UCX in every rank (pml, osc), and a process started without mpirun (the single-rank references)
# runs as a singleton without spawning a daemon of its own: about 0.3 s less per launch, over
# some 500 launches. The transport, and so every result, is the same.
export OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_ess_singleton_isolated=1

names=(); tiers=(); lanes=(); cmds=()
suite() { names+=("$1"); tiers+=("$2"); lanes+=("$3"); shift 3; cmds+=("$*"); }

# ---- the suites: one line each, "suite NAME TIER LANE COMMAND...".
# TIER: fast (in make test-fast and make test) or full (make test only).
# LANE: 1 or 2. The suites of a lane run one after another, the two lanes side by side; put
# suites that write the same files (a build/ directory, a binary) in the same lane, and keep
# the lanes about equally long (each suite's time is printed beside its name, the five slowest
# at the end). A suite is much slower beside another one than alone (tensor-parallel: 26 s alone,
# 156 s beside nvcc; the mpirun suites' ranks spin while they wait, and share the two cores with
# the other lane), but the two lanes still finish sooner than one. (Lane 2 at a lower priority
# was tried: the MPI ranks then starve it.)
# The binaries a suite runs are built by make before this script starts (Makefile: test-noinstall).
# Measured in make test on a fresh clone (2 cores, two lanes; tests took 931 s): nvcc 218 s,
# tensor-parallel 145, training-state 141, gpu-bundle 131, collectives 93, data-parallel 65,
# errors 61 (doc/errors.md's rows, four at a time), reference 55, pipeline 53, zero-plus-plus,
# ps-schedule and build-config 50 each, expert-parallel 48, tasks 39, the others under 40 each.
suite kernels       fast 1 ./test_kernelscpu
suite precision     fast 1 bash test/test_precision.sh
suite reference     fast 2 bash test/test_reference.sh
suite trainer       fast 1 bash test/test_trainer.sh
suite data          fast 1 "$PY" test/test_data.py
suite generate      fast 1 ./test_generatecpu
suite seams         fast 1 ./test_seamscpu
suite pp-schedule   fast 1 ./test_pp_schedulecpu
suite cp-attention  fast 1 bash test/test_cp_attention.sh
suite layout        fast 1 "$PY" test/test_layout.py
suite sft-data      fast 1 bash test/test_sft.sh
suite collectives   fast 1 bash test/test_collectives.sh
suite comm-single   fast 1 ./test_comm_singlecpu
suite collbench     fast 1 bash test/test_collbench.sh
suite launch        fast 2 bash test/test_launch.sh
suite data-parallel full 1 bash test/test_dp.sh
suite ps-schedule   full 1 bash test/test_ps_sched.sh
suite zero-plus-plus full 1 bash test/test_zeropp.sh
suite compression   full 2 bash test/test_compress.sh
suite tensor-parallel full 1 bash test/test_tp.sh
suite pipeline      full 2 bash test/test_pp.sh
suite context-parallel full 2 bash test/test_cp.sh
suite expert-parallel full 2 bash test/test_moe.sh
suite recompute      full 1 bash test/test_recompute.sh
suite tasks         full 1 bash test/test_tasks.sh
suite training-state full 1 bash test/test_state.sh
suite build-config  full 2 bash test/test_build_config.sh
suite errors        full 1 bash test/test_errors.sh
suite failures      full 1 bash test/test_failures.sh
suite mixed-precision full 1 bash test/test_mixed_precision.sh
suite ps-async      full 1 bash test/test_ps_async.sh
suite planner       full 1 bash test/test_planner.sh
suite nvcc          full 2 bash scripts/nvcc_check.sh
# the CUDA code executed on the CPU (dev/emu/): needs the CUDA toolkit's headers, not a GPU.
# gpu-bundle is the GPU bundle's run.sh --quick against the emulated binaries, and with it the CUDA
# builds' reference check (test_gpt2cu bf16 and fp32 against PyTorch, with determinism): about 90 s
# alone; emu-tp 35, emu-pp 32, the others under 30 each.
EMU_INC=$(make -s --no-print-directory emu-available 2>/dev/null)
if [ -n "$EMU_INC" ]; then
    suite emu-kernels     fast 2 bash test/test_emu_kernels.sh
    suite gpu-bundle      full 2 bash test/test_gpu_bundle.sh
    suite emu-trainer     full 1 bash test/test_emu_trainer.sh
    suite emu-dp          full 1 bash test/test_emu_dp.sh
    suite emu-tp          full 2 bash test/test_emu_tp.sh
    suite emu-pp          full 2 bash test/test_emu_pp.sh
    suite emu-cp          full 2 bash test/test_emu_cp.sh
    suite emu-moe         full 2 bash test/test_emu_moe.sh
    suite emu-collectives full 2 bash test/test_emu_collectives.sh
    suite emu-lab         full 2 bash dev/emu/run_lab.sh build/emu/dev/cuda encoder_forward encoder_backward layernorm_forward \
        layernorm_backward matmul_forward matmul_backward attention_forward attention_backward gelu_forward gelu_backward \
        classifier adamw global_norm
else
    echo "== emu-*: skipped, the CUDA toolkit's headers (cuda_runtime.h) were not found: the emulated CUDA suites need them (no GPU)"
fi

# ---- which suites
selected=()
case "${1:-}" in
    "") selected=("${!names[@]}") ;;
    --fast) for i in "${!names[@]}"; do [ "${tiers[$i]}" = fast ] && selected+=("$i"); done ;;
    *) for want in "$@"; do
           found=0
           for i in "${!names[@]}"; do [ "${names[$i]}" = "$want" ] && { selected+=("$i"); found=1; }; done
           [ $found = 1 ] || { echo "error: no suite '$want' (suites: ${names[*]})"; exit 2; }
       done ;;
esac

# ---- run them: each lane in the background; a suite leaves NAME.log and NAME.status
# ("exit-status seconds") in build/test-logs
run_lane() {
    local lane=$1 i start
    for i in "${selected[@]}"; do
        [ "${lanes[$i]}" = "$lane" ] || continue
        start=$SECONDS
        eval "${cmds[$i]}" >"$LOGS/${names[$i]}.log" 2>&1 </dev/null
        echo "$? $((SECONDS - start))" >"$LOGS/${names[$i]}.status.tmp"
        mv "$LOGS/${names[$i]}.status.tmp" "$LOGS/${names[$i]}.status"
    done
}
nlanes=${LANES:-2}
if [ "$nlanes" = 1 ]; then for i in "${selected[@]}"; do lanes[$i]=1; done; fi
for i in "${selected[@]}"; do rm -f "$LOGS/${names[$i]}.status"; done
start=$SECONDS
pids=()
set -m   # each lane in its own process group, so that the trap below can stop it with its children
for lane in $(printf '%s\n' "${lanes[@]}" | sort -u); do
    run_lane "$lane" &
    pids+=($!)
done
set +m
# Ctrl-C or a kill stops the lanes too
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null; done; exit 130' INT TERM
lanes_running() { local p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

# ---- print each suite's results in table order, as they come in
passed=0
failed=0
for i in "${selected[@]}"; do
    name=${names[$i]}
    log=$LOGS/$name.log
    status=$LOGS/$name.status
    while [ ! -e "$status" ] && lanes_running; do sleep 1; done
    [ -e "$status" ] || echo "1 0" >"$status"   # its lane ended without it (killed)
    [ -e "$log" ] || : >"$log"
    read -r rc secs <"$status"
    echo "== $name: ${cmds[$i]} (${secs} s)"
    p=$(grep -c '^PASS ' "$log")
    f=$(grep -c '^FAIL ' "$log")
    grep -E '^(PASS|FAIL|SKIP|skipping) ' "$log" | sed 's/^/   /'
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "   FAIL $name exited with status $rc:"
        tail -5 "$log" | sed 's/^/      /'
        f=1
    elif [ "$f" -gt 0 ]; then
        echo "   (details in $log)"
    fi
    passed=$((passed + p))
    failed=$((failed + f))
done
wait

echo
# the time table's tail: the five slowest suites (the budget is checked by people, not by a test)
echo "slowest suites: $(for i in "${selected[@]}"; do read -r _ secs <"$LOGS/${names[$i]}.status"; echo "$secs ${names[$i]}"; done |
    sort -rn | head -5 | awk '{printf "%s%s %d s", (NR > 1 ? ", " : ""), $2, $1}')"
echo "tests took $((SECONDS - start)) s ($([ "$nlanes" = 1 ] && echo "one lane" || echo "two lanes side by side"))"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
