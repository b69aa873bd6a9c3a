#!/usr/bin/env bash
# Runs the tests and counts the PASS/FAIL lines they print (make test, make test-fast).
#   bash test/run_tests.sh            every suite
#   bash test/run_tests.sh --fast     the fast tier: a few minutes, for the edit loop
#   bash test/run_tests.sh NAME...    the named suites only
# The suites run in three lanes side by side (LANES=1: all in one lane). Each suite's full
# output goes to build/test-logs/NAME.log; its PASS/FAIL lines are printed in the order of
# the table below, each suite as soon as it and the ones above it are done.
# The last line is "N passed, M failed"; the exit status is 0 only when M is 0. A suite that
# exits non-zero without printing a FAIL line (a crash, a missing prerequisite) counts as one
# failure.
set -u
cd "$(dirname "$0")/.."
LOGS=build/test-logs
mkdir -p "$LOGS"
# python3, as the suites call it (some 300 times: compare_runs.py after every equivalence run, the
# data generators): the system's /usr/bin/python3 (which the PyTorch reference uses too) starts in
# 20 ms; a version manager's python3 first in PATH can take 170 (pyenv: a bash shim, then the .pth
# files of its site). So python3 is the system's here, through build/test/bin first on PATH, unless
# PYTHON names another (the scripts need only the standard library).
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3 ]; then
    mkdir -p build/test/bin
    ln -sf /usr/bin/python3 build/test/bin/python3
    export PATH="$PWD/build/test/bin:$PATH"
fi
# The suites' MPI jobs run on this one machine and talk through shared memory (the ob1 PML over
# the vader BTL, which is what Open MPI ends up with here anyway). Said up front, it skips probing
# UCX in every rank (pml, osc), and a process started without mpirun (the single-rank references)
# runs as a singleton without spawning a daemon of its own: about 0.3 s less per launch, over
# some 500 launches. The transport, and so every result, is the same.
export OMPI_MCA_pml=ob1 OMPI_MCA_osc=^ucx OMPI_MCA_ess_singleton_isolated=1
# Nor does any process read the PCI devices' configuration (hwloc's I/O discovery, for placing
# ranks near network cards: a quarter of a launch's CPU time here, and no card is used).
export HWLOC_COMPONENTS=-linuxio,-pci
# Every rank mpirun starts sleeps 50 us where it would spin waiting for a message (test/wait_sleep.c,
# built by make with the MPI targets): the suites share two cores, and a spinning rank slows the
# rank it waits for (tensor-parallel: 150 s beside the nvcc suite, 35 s with this). Open MPI sets
# the variable in the ranks only (mpirun -x cannot be used beside it; no suite does).
# An OpenMP thread that has finished its share waits asleep, not spinning (libgomp spins some
# milliseconds by default): the emulator's cuBLAS stand-in and the 2-thread runs parallelise short
# loops, and a spinning thread takes the core from another lane (gpu-bundle: 94 s of CPU, 73
# with this, in the same wall time). Results do not depend on it.
export OMP_WAIT_POLICY=passive
if [ -f build/test/libwait_sleep.so ]; then
    export OMPI_MCA_mca_base_env_list="LD_PRELOAD=$PWD/build/test/libwait_sleep.so"
fi

names=(); tiers=(); lanes=(); cmds=()
suite() { names+=("$1"); tiers+=("$2"); lanes+=("$3"); shift 3; cmds+=("$*"); }

# ---- the suites: one line each, "suite NAME TIER LANE COMMAND...".
# TIER: fast (in make test-fast and make test) or full (make test only).
# LANE: 1, 2 or 3. The suites of a lane run one after another, the lanes side by side; put suites
# that write the same files (a build/ directory, a binary, the PyTorch reference cache) in the
# same lane. Lanes 1 and 2 hold the suites that keep a core busy (compiles, the emulator, MPI jobs
# of 1-2 ranks that compute); keep them about equally long in CPU time. Lane 3 holds the suites
# that mostly wait (watchdog timeouts, hangs that must be detected, ranks killed, latency-bound
# collectives on up to 8 ranks): alone they use a third of a core, so beside the other two they
# cost little and their waiting overlaps real work. Each suite's wall time and CPU time are printed
# beside its name (the five slowest and the CPU total at the end); a suite takes 1.2-3x longer here
# than alone.
# The binaries a suite runs are built by make before this script starts (Makefile: test-noinstall).
# In make test on a fresh clone, 2 cores (wall s / CPU s): nvcc 224/246 (two compiles at a time),
# errors 95/28, collectives 92/55, gpu-bundle 80/67, training-state 79/43, build-config 76/49, the
# others under 65 s each (cluster 30/2: its ranks run under the nodes' daemons, not counted); the
# suites' CPU time 974 s, tests took 535 s (2026-11-28; the same day before nvcc_check.sh stopped
# generating and linking the host code of every CUDA program: nvcc 374/385, 1157-1180 s and
# 640-670 s). Moving planner and emu-collectives from lane 2 to lane 3 did not help. The
# machine is busy all the time (1.9 cores): a suite made cheaper in CPU makes the whole run shorter,
# a suite moved to another lane hardly does. On a fresh clone, 2-core Zen 4, 2026-12-02: the suites'
# CPU time 897 s, tests took 556 s, the whole CI 780 s (layout 2 s when cached; on a fresh clone
# its headers' compiles ~26 s of CPU: a compile per header, 159 s, had taken the run past 600 s).
suite kernels       fast 1 ./test_kernelscpu
suite precision     fast 1 bash test/test_precision.sh
suite reference     fast 2 bash test/test_reference.sh
suite trainer       fast 1 bash test/test_trainer.sh
suite data          fast 1 "$PY" test/test_data.py
suite generate      fast 1 ./test_generatecpu
suite seams         fast 1 ./test_seamscpu
suite profile       fast 1 bash test/test_profile.sh
suite pp-schedule   fast 1 ./test_pp_schedulecpu
suite cp-attention  fast 1 bash test/test_cp_attention.sh
suite layout        fast 1 "$PY" test/test_layout.py
suite flag-roles    fast 1 bash test/test_flag_roles.sh
suite syllabus      fast 1 "$PY" test/test_syllabus.py
suite recipe        fast 1 "$PY" test/test_recipe.py
suite sft-data      fast 1 bash test/test_sft.sh
suite collectives   fast 3 bash test/test_collectives.sh
suite comm-single   fast 1 ./test_comm_singlecpu
suite collbench     fast 3 bash test/test_collbench.sh
suite launch        fast 3 bash test/test_launch.sh
suite data-parallel full 1 bash test/test_dp.sh
suite ps-schedule   full 3 bash test/test_ps_sched.sh
suite zero-plus-plus full 1 bash test/test_zeropp.sh
suite compression   full 1 bash test/test_compress.sh
suite tensor-parallel full 1 bash test/test_tp.sh
suite pipeline      full 1 bash test/test_pp.sh
suite context-parallel full 1 bash test/test_cp.sh
suite expert-parallel full 3 bash test/test_moe.sh
suite recompute      full 1 bash test/test_recompute.sh
suite tasks         full 1 bash test/test_tasks.sh
suite training-state full 1 bash test/test_state.sh
suite build-config  full 2 bash test/test_build_config.sh
suite errors        full 3 bash test/test_errors.sh
suite failures      full 3 bash test/test_failures.sh
suite mixed-precision full 1 bash test/test_mixed_precision.sh
suite ps-async      full 3 bash test/test_ps_async.sh
suite planner       full 2 bash test/test_planner.sh
suite cluster       full 3 bash test/test_cluster.sh
suite nvcc          full 2 bash scripts/nvcc_check.sh
# the CUDA code executed on the CPU (dev/emu/): needs the CUDA toolkit's headers, not a GPU.
# gpu-bundle is the GPU bundle's run.sh --quick against the emulated binaries, and with it the CUDA
# builds' reference check (test_gpt2cu bf16 and fp32 against PyTorch, with determinism): about 90 s
# alone; gpu-bundle-mpi is the bundle's run.sh --part mpi on the emulated MPI programs built against
# the bundle's own Open MPI, with the system's MPI hidden (about 70 s of CPU); emu-tp 35, emu-pp 32,
# the others under 30 each.
EMU_INC=$(make -s --no-print-directory emu-available 2>/dev/null)
if [ -n "$EMU_INC" ]; then
    suite emu-kernels     fast 2 bash test/test_emu_kernels.sh
    suite gpu-bundle      full 2 bash test/test_gpu_bundle.sh
    suite gpu-bundle-mpi  full 2 bash test/test_gpu_bundle_mpi.sh
    suite emu-trainer     full 1 bash test/test_emu_trainer.sh
    suite emu-dp          full 1 bash test/test_emu_dp.sh
    suite emu-tp          full 1 bash test/test_emu_tp.sh
    suite emu-pp          full 1 bash test/test_emu_pp.sh
    suite emu-cp          full 1 bash test/test_emu_cp.sh
    suite emu-moe         full 1 bash test/test_emu_moe.sh
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
    # Open MPI's session directory (its files and sockets) per lane: a process started without
    # mpirun is a singleton of job family 0, so two singletons starting at the same moment in
    # two lanes made the same directory and one failed ("mkdir ... File exists", orte_init failed)
    export OMPI_MCA_orte_tmpdir_base=/tmp/llmc-test-$$-lane$lane
    mkdir -p "$OMPI_MCA_orte_tmpdir_base"
    for i in "${selected[@]}"; do
        [ "${lanes[$i]}" = "$lane" ] || continue
        start=$SECONDS
        # the suite in a subshell that ends with "times": its second line is the CPU time (user,
        # system) of every process the suite started and waited for, the ranks included
        ( eval "${cmds[$i]}" >"$LOGS/${names[$i]}.log" 2>&1 </dev/null; rc=$?; times >"$LOGS/${names[$i]}.times"; exit $rc )
        rc=$?
        cpu=$(tail -n 1 "$LOGS/${names[$i]}.times" | awk '{ n = 0; for (f = 1; f <= NF; f++) { split($f, p, "m"); n += p[1] * 60 + p[2] } printf "%.0f", n }')
        echo "$rc $((SECONDS - start)) ${cpu:-0}" >"$LOGS/${names[$i]}.status.tmp"
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
    [ -e "$status" ] || echo "1 0 0" >"$status"   # its lane ended without it (killed)
    [ -e "$log" ] || : >"$log"
    read -r rc secs cpu <"$status"
    echo "== $name: ${cmds[$i]} (${secs} s, ${cpu:-0} s of CPU)"
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
rm -rf /tmp/llmc-test-$$-lane*

echo
# the time table's tail: the five slowest suites (the budget is checked by people, not by a test)
echo "slowest suites: $(for i in "${selected[@]}"; do read -r _ secs _ <"$LOGS/${names[$i]}.status"; echo "$secs ${names[$i]}"; done |
    sort -rn | head -5 | awk '{printf "%s%s %d s", (NR > 1 ? ", " : ""), $2, $1}')"
echo "CPU time of the suites: $(for i in "${selected[@]}"; do read -r _ _ c <"$LOGS/${names[$i]}.status"; echo "${c:-0}"; done |
    awk '{ n += $1 } END { printf "%d", n }') s"
echo "tests took $((SECONDS - start)) s ($([ "$nlanes" = 1 ] && echo "one lane" || echo "lanes side by side"))"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
