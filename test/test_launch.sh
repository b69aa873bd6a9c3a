#!/usr/bin/env bash
# scripts/launch.sh, the lab launcher: where it thinks it runs (one machine, a hostfile, Slurm,
# PBS), how many ranks it picks (GPUs, slots, CPU defaults, --np) and the mpirun line it prints.
#   one machine / hostfile of this host:  --dry-run lines, then real mpirun runs (2 ranks)
#   Slurm, PBS, several hosts:            --dry-run only (the hosts do not exist), from faked
#                                         SLURM_* / PBS_* variables and files (real runs on
#                                         several hosts: test/test_cluster.sh, on the nodes that
#                                         scripts/cluster.sh makes on this machine)
#   GPUs:                                 CUDA_VISIBLE_DEVICES, a fake nvidia-smi
#   the program's arguments, --tp/--dp, bad options, a missing hostfile, a missing mpirun
# Runs in a clean environment: no scheduler variables, no HOSTFILE, and a fake nvidia-smi that
# finds no GPU first on PATH, so the answers are the same on a GPU machine. A few seconds.
set -u
cd "$(dirname "$0")/.." || exit 1
L=scripts/launch.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

for v in $(compgen -v SLURM_) $(compgen -v PBS_) HOSTFILE CUDA_VISIBLE_DEVICES; do unset "$v"; done
mkdir -p "$T/nogpu" "$T/gpu4" "$T/nompi"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."\nexit 9\n' >"$T/nogpu/nvidia-smi"
# shellcheck disable=SC2016  # $i is the fake script's own variable
printf '#!/bin/sh\nfor i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done\n' >"$T/gpu4/nvidia-smi"
chmod +x "$T/nogpu/nvidia-smi" "$T/gpu4/nvidia-smi"
cp "$T/nogpu/nvidia-smi" "$T/nompi/"
export PATH="$T/nogpu:$PATH"
cores=$(nproc)

pass() { echo "PASS $1"; }
fail() {
    echo "FAIL $1"; shift
    local line
    for line in "$@"; do echo "     $line"; done
    while IFS= read -r line; do echo "     | $line"; done <<<"$out"
}
# run CMD...: out = its stdout and stderr, rc = its exit status, line = the printed mpirun line
run() {
    out=$(timeout 60 "$@" 2>&1 </dev/null)
    rc=$?
    line=$(grep -m1 '^launch: mpirun ' <<<"$out")
    line=${line#launch: }
}
# expect NAME RC WANT...: after run, the exit status must be RC ("nz": non-zero) and each WANT
# a substring of the output; a WANT written "line:TEXT" must be in the mpirun line, "!TEXT"
# must not be in the output
expect() {
    local name=$1 want_rc=$2 w why=()
    shift 2
    if [ "$want_rc" = nz ]; then
        [ "$rc" != 0 ] || why+=("exit status 0, want non-zero")
    elif [ "$rc" != "$want_rc" ]; then
        why+=("exit status $rc, want $want_rc")
    fi
    for w in "$@"; do
        case $w in
            line:*) [[ "$line " == *"${w#line:}"* ]] || why+=("the mpirun line lacks '${w#line:}'") ;;
            !*) [[ $out != *"${w#!}"* ]] || why+=("the output has '${w#!}'") ;;
            *) [[ $out == *"$w"* ]] || why+=("the output lacks '$w'") ;;
        esac
    done
    if [ ${#why[@]} = 0 ]; then pass "$name"; else fail "$name" "${why[@]}"; fi
}
# ranks_of: the rank numbers the real run printed ("rank N" lines), sorted
ranks_of() { grep -o '^rank [0-9]*' <<<"$out" | sort | tr '\n' ' '; }
# shellcheck disable=SC2016  # expanded by each rank's sh, not here
RANKPROG=(sh -c 'echo rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE')

# ---- one machine, no GPU
run $L --dry-run -- hostname
expect "one machine: default 2 CPU ranks, no --host" 0 "launch: one machine (" "1 host x 2 per host" \
    "CPU: no GPU, default 2" "line:mpirun -np 2 hostname" "!--host" "!--oversubscribe"
if [ "$(id -u)" = 0 ]; then
    expect "as root: says it exports OMPI_ALLOW_RUN_AS_ROOT" 0 \
        "exported OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
fi
run $L --dry-run --np $((cores + 1)) -- hostname
expect "one machine: --np $((cores + 1)) > $cores cores adds --oversubscribe" 0 \
    "--np $((cores + 1)) on one machine" "line:mpirun -np $((cores + 1)) --oversubscribe hostname"
run $L --np 2 -- "${RANKPROG[@]}"
r=$(ranks_of)
if [ "$rc" = 0 ] && [ "$r" = "rank 0 rank 1 " ] && grep -q 'of 2$' <<<"$out"; then
    pass "one machine: a real run of --np 2 prints ranks 0 and 1 of 2"
else
    fail "one machine: a real run of --np 2" "exit status $rc, ranks '$r' (want 'rank 0 rank 1 ')"
fi
run $L -- sh -c 'exit 3'
expect "one machine: a program that exits 3 makes the launcher exit non-zero (got $rc)" nz "line:mpirun -np 2 sh -c 'exit 3'"
run $L --np 1 -- true
expect "one machine: a program that succeeds gives exit status 0" 0 "line:mpirun -np 1 true"

# ---- a hostfile naming this machine
printf '# this machine\n\nlocalhost slots=2\n' >"$T/hf_localhost"
printf '%s slots=2   # by name\n' "$(hostname)" >"$T/hf_name"
run $L --dry-run --hostfile "$T/hf_localhost" -- hostname
expect "hostfile localhost slots=2: -np 2 --host localhost:2" 0 "launch: hostfile ($T/hf_localhost" \
    "hostfile's slots=" "line:mpirun -np 2 --host localhost:2 hostname"
run $L --hostfile "$T/hf_localhost" -- "${RANKPROG[@]}"
r=$(ranks_of)
if [ "$rc" = 0 ] && [ "$r" = "rank 0 rank 1 " ]; then pass "hostfile localhost: a real run prints ranks 0 and 1"
else fail "hostfile localhost: a real run" "exit status $rc, ranks '$r' (want 'rank 0 rank 1 ')"; fi
run env HOSTFILE="$T/hf_name" $L --dry-run -- hostname
expect "HOSTFILE=\$(hostname) slots=2: -np 2 --host $(hostname):2" 0 "from HOSTFILE" \
    "line:mpirun -np 2 --host $(hostname):2 hostname"
run env HOSTFILE="$T/hf_name" $L -- "${RANKPROG[@]}"
r=$(ranks_of)
if [ "$rc" = 0 ] && [ "$r" = "rank 0 rank 1 " ]; then pass "hostfile \$(hostname): a real run prints ranks 0 and 1"
else fail "hostfile \$(hostname): a real run" "exit status $rc, ranks '$r' (want 'rank 0 rank 1 ')"; fi

# ---- hostfiles naming several hosts (dry runs only)
printf '# two hosts\n\n  hostA slots=3   # the big one\nhostB slots=1\n\n' >"$T/hf_two"
run $L --dry-run --hostfile "$T/hf_two" -- ./prog
expect "hostfile with comments, blank lines, uneven slots: -np 4 --host hostA:3,hostB:1" 0 \
    "4 ranks = 2 hosts x 3+1 per host" "line:mpirun -np 4 --host hostA:3,hostB:1 ./prog"
printf 'hostA\nhostB\nhostC\n' >"$T/hf_noslots"
run $L --dry-run --hostfile "$T/hf_noslots" -- ./prog
expect "hostfile without slots, 3 hosts: 1 CPU rank per host" 0 "CPU: no GPU, default 1 rank per host" \
    "line:mpirun -np 3 --host hostA:1,hostB:1,hostC:1 ./prog"
run $L --dry-run --hostfile "$T/hf_two" --np 6 -- ./prog
expect "hostfile: --np 6 over 4 slots sets the total and oversubscribes" 0 "--np 6 sets the total" \
    "line:mpirun -np 6 --oversubscribe --host hostA:3,hostB:1 ./prog"
run $L --dry-run --hostfile "$T/hf_two" --ranks-per-node 2 -- ./prog
expect "hostfile: --ranks-per-node 2 wins over the slots" 0 "line:mpirun -np 4 --host hostA:2,hostB:2 ./prog"
printf '# launch.sh mpirun options: --mca plm_rsh_agent /x/rsh --mca btl self,tcp\nhostA slots=2\nhostB slots=2\n' >"$T/hf_opts"
run $L --dry-run --hostfile "$T/hf_opts" --mpi-args "--map-by node" -- ./prog
expect "hostfile with a '# launch.sh mpirun options:' line: its options, then --mpi-args, before the program" 0 \
    "the hostfile's mpirun options: --mca plm_rsh_agent /x/rsh --mca btl self,tcp" \
    "line:mpirun -np 4 --host hostA:2,hostB:2 --mca plm_rsh_agent /x/rsh --mca btl self,tcp --map-by node ./prog"

# ---- Slurm, simulated
SL=(env SLURM_JOB_ID=1 "SLURM_JOB_NODELIST=node[01-03,07]")
run "${SL[@]}" SLURM_NTASKS_PER_NODE=4 $L --dry-run -- ./prog
expect "Slurm node[01-03,07], SLURM_NTASKS_PER_NODE=4: -np 16, 4 hosts x 4" 0 "launch: Slurm (job 1" \
    "16 ranks = 4 hosts x 4 per host (slots: SLURM_NTASKS_PER_NODE=4)" \
    "line:mpirun -np 16 --host node01:4,node02:4,node03:4,node07:4 ./prog"
run "${SL[@]}" SLURM_GPUS_ON_NODE=4 $L --dry-run -- ./prog
expect "Slurm node[01-03,07], SLURM_GPUS_ON_NODE=4: -np 16 by the GPU rule" 0 \
    "(GPUs: SLURM_GPUS_ON_NODE=4)" "line:mpirun -np 16 --host node01:4,node02:4,node03:4,node07:4 ./prog"
run env SLURM_JOB_ID=7 "SLURM_JOB_NODELIST=gpu[1-2]" SLURM_GPUS_ON_NODE=2 $L --dry-run -- ./prog
expect "Slurm gpu[1-2], SLURM_GPUS_ON_NODE=2: -np 4" 0 "line:mpirun -np 4 --host gpu1:2,gpu2:2 ./prog"
run env SLURM_JOB_ID=1 "SLURM_NODELIST=node[01-03,07],gpu5" $L --dry-run -- ./prog
expect "Slurm SLURM_NODELIST node[01-03,07],gpu5: 5 hosts, 1 CPU rank each" 0 "5 hosts" \
    "line:mpirun -np 5 --host node01:1,node02:1,node03:1,node07:1,gpu5:1 ./prog"
run env SLURM_JOB_ID=1 "SLURM_JOB_NODELIST=c[8-10]" "SLURM_TASKS_PER_NODE=2(x2),1" $L --dry-run -- ./prog
expect "Slurm c[8-10] (no padding), SLURM_TASKS_PER_NODE=2(x2),1: c8:2,c9:2,c10:1" 0 \
    "3 hosts x 2+2+1 per host" "line:mpirun -np 5 --host c8:2,c9:2,c10:1 ./prog"
run env SLURM_JOB_ID=1 "SLURM_JOB_NODELIST=r[1-2]n[001-002]" SLURM_GPUS_PER_NODE=gpu:a100:2 $L --dry-run -- ./prog
expect "Slurm r[1-2]n[001-002] (two ranges), SLURM_GPUS_PER_NODE=gpu:a100:2" 0 \
    "line:mpirun -np 8 --host r1n001:2,r1n002:2,r2n001:2,r2n002:2 ./prog"
run "${SL[@]}" SLURM_GPUS_ON_NODE=4 $L --dry-run --gpus-per-node 8 -- ./prog
expect "Slurm: --gpus-per-node 8 wins over SLURM_GPUS_ON_NODE=4" 0 "(GPUs: --gpus-per-node 8)" "line:mpirun -np 32 "
run "${SL[@]}" SLURM_GPUS_ON_NODE=4 $L --dry-run --np 6 -- ./prog
expect "Slurm: --np 6 sets the total over 16 GPUs" 0 "--np 6 sets the total" \
    "line:mpirun -np 6 --host node01:4,node02:4,node03:4,node07:4 ./prog" "!--oversubscribe"
run env "SLURM_JOB_NODELIST=node[01-03,07]" SLURM_GPUS_ON_NODE=4 $L --dry-run -- ./prog
expect "no SLURM_JOB_ID: not a Slurm job, one machine" 0 "launch: one machine (" "!--host"

# ---- PBS, simulated: PBS_NODEFILE has a line per slot
printf 'x1000c0s0b0n0\nx1000c0s0b0n0\nx1000c0s0b0n0\nx1000c0s1b0n0\nx1000c0s1b0n0\nx1000c0s1b0n0\nx1000c0s2b0n0\n' >"$T/pbs_nodes"
run env PBS_JOBID=123.pbs01 PBS_NODEFILE="$T/pbs_nodes" $L --dry-run -- ./prog
expect "PBS nodefile 3+3+1 lines: -np 7 --host x1000c0s0b0n0:3,x1000c0s1b0n0:3,x1000c0s2b0n0:1" 0 \
    "launch: PBS (job 123.pbs01" "3 hosts x 3+3+1 per host" \
    "line:mpirun -np 7 --host x1000c0s0b0n0:3,x1000c0s1b0n0:3,x1000c0s2b0n0:1 ./prog"
run env PBS_JOBID=123.pbs01 PBS_NODEFILE="$T/pbs_nodes" CUDA_VISIBLE_DEVICES=0,1,2,3 $L --dry-run -- ./prog
expect "PBS with 4 GPUs per node: 4 ranks on each of the 3 hosts" 0 \
    "line:mpirun -np 12 --host x1000c0s0b0n0:4,x1000c0s1b0n0:4,x1000c0s2b0n0:4 ./prog"
run env PBS_JOBID=9 PBS_NODEFILE="$T/no_such_nodefile" $L --dry-run -- ./prog
expect "PBS: a missing PBS_NODEFILE is an error, exit 1" 1 "not found"

# ---- GPUs on one machine
run env CUDA_VISIBLE_DEVICES=0,1,2 $L --dry-run -- ./prog
expect "CUDA_VISIBLE_DEVICES=0,1,2: 3 ranks by the GPU rule" 0 "(GPUs: CUDA_VISIBLE_DEVICES=0,1,2)" \
    "3 ranks = 1 host x 3 per host" "line:mpirun -np 3 "
run env CUDA_VISIBLE_DEVICES= $L --dry-run -- ./prog
expect "CUDA_VISIBLE_DEVICES empty: no GPU, CPU ranks" 0 "hides the GPUs" "line:mpirun -np 2 ./prog"
run env PATH="$T/gpu4:$PATH" $L --dry-run -- ./prog
expect "nvidia-smi -L lists 4 GPUs: 4 ranks" 0 "(GPUs: nvidia-smi -L lists 4)" "line:mpirun -np 4 "

# ---- the program's arguments and the mesh convenience
run $L --dry-run -- ./train_gpt2cpu --tp 2 --sp --zero 3 --dp 2
expect "mesh flags after the program pass through verbatim" 0 \
    "line:mpirun -np 2 ./train_gpt2cpu --tp 2 --sp --zero 3 --dp 2"
os4=""; [ "$cores" -ge 4 ] || os4="--oversubscribe "
run $L --dry-run --np 4 ./train_gpt2cpu --tp 2 --np 9 --dry-run
expect "without --: the first non-option is the program, its options stay its own" 0 \
    "line:mpirun -np 4 $os4./train_gpt2cpu --tp 2 --np 9 --dry-run"
run $L --dry-run --np 4 --tp 2 -- ./train_gpt2cpu --sp --zero 3
expect "launcher --tp 2 on 4 ranks is appended to the program's arguments" 0 "./train_gpt2cpu --sp --zero 3 --tp 2"
run $L --dry-run --np 4 --tp 2 --dp 2 -- ./train_gpt2cpu
expect "launcher --tp 2 --dp 2 on 4 ranks: both appended" 0 "./train_gpt2cpu --tp 2 --dp 2"
run $L --dry-run --np 4 --tp 3 -- ./train_gpt2cpu
expect "launcher --tp 3 on 4 ranks fails" nz "launch: --tp 3 does not divide 4 ranks" "!launch: mpirun"
run $L --dry-run --np 4 --tp 2 --dp 3 -- ./train_gpt2cpu
expect "launcher --tp 2 --dp 3 on 4 ranks fails" nz "launch: --dp 3 x --tp 2 = 6, not the 4 ranks"
run $L --dry-run --mpi-args "--bind-to none --mca btl self,vader" -- ./prog
expect "--mpi-args go before the program" 0 "line:mpirun -np 2 --bind-to none --mca btl self,vader ./prog"

# ---- errors
run $L --dry-run --hostfile "$T/no_such_hostfile" -- ./prog
expect "missing hostfile: a clear error, exit 1" 1 "launch: hostfile '$T/no_such_hostfile' not found"
printf '# nothing here\n\n   \n' >"$T/hf_empty"
run env HOSTFILE="$T/hf_empty" $L --dry-run -- ./prog
expect "empty hostfile: a clear error, exit 1" 1 "names no host"
run $L --dry-run --frobnicate -- ./prog
expect "unknown option: the usage line, exit 2" 2 "unknown option '--frobnicate'" "usage: scripts/launch.sh"
run $L --dry-run --np two -- ./prog
expect "--np two: exit 2" 2 "--np needs a whole number from 1 to 1048576, got 'two'"
# counts judged as text before bash's arithmetic, which wraps at 2^63 without a word (issue 56)
run $L --dry-run --np 4 --tp 18446744073709551616 -- ./train_gpt2cpu
expect "--tp 2^64: exit 2, no mpirun line" 2 "--tp needs a whole number from 1 to 1048576, got '18446744073709551616'" "!launch: mpirun"
run $L --dry-run --np -4 -- ./prog
expect "--np -4: exit 2" 2 "--np needs a whole number from 1 to 1048576, got '-4'"
run $L --dry-run --np 04 -- ./prog
expect "--np 04 (not plain digits): exit 2" 2 "--np needs a whole number from 1 to 1048576, got '04'"
run $L --dry-run --np 2000000 -- ./prog
expect "--np 2000000: more ranks than 2^20, exit 2" 2 "--np needs a whole number from 1 to 1048576, got '2000000'"
run $L --dry-run --np 4 --tp 2 -- ./train_gpt2cpu --pp 99999999999999999999
expect "the program's --pp 10^20 with --tp: exit 1" 1 "the program's --pp '99999999999999999999' is not a count from 1 to 1048576"
printf 'hostA slots=9223372036854775807\nhostB slots=2\n' >"$T/hf_huge"
run $L --dry-run --hostfile "$T/hf_huge" -- ./prog
expect "hostfile slots=2^63-1: exit 1" 1 "hostfile '$T/hf_huge': bad 'slots=9223372036854775807' for hostA (slots: 1 to 1048576)"
printf 'hostA slots=1000000\nhostB slots=1000000\n' >"$T/hf_sum"
run $L --dry-run --hostfile "$T/hf_sum" -- ./prog
expect "hostfile slots adding up past 2^20: exit 1" 1 "the hosts' slots add up to 2000000 ranks, more than 1048576"
run env SLURM_JOB_ID=1 SLURM_JOB_NODELIST="n[1-2]" SLURM_NTASKS_PER_NODE=-3 $L --dry-run -- ./prog
expect "SLURM_NTASKS_PER_NODE=-3: exit 1" 1 "SLURM_NTASKS_PER_NODE='-3' is not a count from 1 to 1048576"
run $L --dry-run --
expect "no program: exit 2" 2 "no program"
run env PATH="$T/nompi" "$BASH" $L -- ./prog
n=$(grep -c . <<<"$out")
expect "no mpirun: one line with the install command, exit 1 ($n line)" 1 \
    "apt-get install openmpi-bin libopenmpi-dev"
[ "$n" = 1 ] || fail "no mpirun: one line only" "$n lines"
exit 0
