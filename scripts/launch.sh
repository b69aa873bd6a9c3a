#!/usr/bin/env bash
# The lab launcher (our ezpz): finds the job's machines, starts one rank per GPU, runs mpirun.
#
#   where am I?  (first match)        ranks per host  (first match)        the line
#   1. --hostfile FILE (the option)   --ranks-per-node N                   mpirun -np N
#   2. Slurm: SLURM_JOB_ID and        GPUs: --gpus-per-node N,               [--oversubscribe]
#      SLURM_JOB_NODELIST (or           SLURM_GPUS_ON_NODE (or _PER_NODE),   [--host h1:s1,h2:s2]
#      SLURM_NODELIST), expanded        CUDA_VISIBLE_DEVICES (its entries),  [--mpi-args ...]
#      here: node[01-03,07],gpu5 ->     nvidia-smi -L (its GPU lines)        PROGRAM ARGS...
#      node01 node02 node03 node07    slots: SLURM_NTASKS_PER_NODE or          [--tp N] [--dp N]
#      gpu5                             SLURM_TASKS_PER_NODE, the PBS
#   3. PBS: PBS_JOBID and               nodefile's lines per host, the
#      PBS_NODEFILE (a line per slot)   hostfile's slots=N
#   4. a hostfile: $HOSTFILE, lines   CPU: 1 rank per host on several hosts,
#      "host" or "host slots=N"         2 on one machine
#   5. one machine: this host         --np N always sets the total
#
#   scripts/launch.sh [options] [--] PROGRAM [ARGS...]
#     --np N               the total number of ranks (default: hosts x ranks per host)
#     --gpus-per-node N    GPUs per host (default: detected as above)
#     --ranks-per-node N   ranks per host, whatever the GPUs
#     --hostfile FILE      the hosts ("host" or "host slots=N" a line, # comments); an explicit
#                          --hostfile wins over Slurm and PBS, $HOSTFILE comes after them
#     --tp N, --dp N       appended to the program's arguments, after a check that
#                          tp x dp (x the program's --pp, --cp if any) = the ranks; dp defaults
#                          to ranks / tp
#     --mpi-args "..."     more mpirun options (split on spaces), e.g. "--bind-to none"; a hostfile
#                          may carry its own in a line "# launch.sh mpirun options: ..." (the
#                          clusters of scripts/cluster.sh: how mpirun reaches their nodes)
#     --dry-run            print what it would run and exit 0
#   Everything after PROGRAM goes to it unchanged (the mesh flags: --tp 2 --sp --zero 3 --dp 2).
#   The first argument that is not an option is the program, so "--" is optional.
#
# Before running it prints one block, e.g. for a Slurm job on four 4-GPU nodes:
#   launch: Slurm (job 1, SLURM_JOB_NODELIST=node[01-03,07]: 4 hosts)
#   launch: 16 ranks = 4 hosts x 4 per host (GPUs: SLURM_GPUS_ON_NODE=4)
#   launch: mpirun -np 16 --host node01:4,node02:4,node03:4,node07:4 ./train_gpt2cu --tp 2
# As root it exports OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (and says so).
# --oversubscribe is added when the ranks exceed the slots of the hosts, or on one machine its
# cores (nproc). Exit status: mpirun's (the program's); 1 when mpirun is missing, the hostfile
# is missing or empty, or --tp/--dp do not fit the ranks; 2 for a bad option.
# GPU counts are read on this host and assumed the same on every host of the job.
#
# The FSDP + TP lab, on whatever this runs on (a laptop: 2 CPU ranks; a 4-GPU node: 4 ranks):
#   scripts/launch.sh --tp 2 -- ./train_gpt2cpu --sp --zero 3 --seq 44 --batch 48
set -u

usage() {
    echo "usage: scripts/launch.sh [--np N] [--gpus-per-node N] [--ranks-per-node N] [--hostfile FILE]" \
        "[--tp N] [--dp N] [--mpi-args \"...\"] [--dry-run] [--] PROGRAM [ARGS...]"
}
die() { echo "launch: $*" >&2; exit 1; }
bad_usage() { echo "launch: $*" >&2; usage >&2; exit 2; }

# ---- options
opt_np="" opt_gpus="" opt_rpn="" opt_hostfile="" opt_tp="" opt_dp="" opt_mpi_args="" dry_run=0
# Every count (options, hostfile slots, Slurm's variables, the program's --pp/--cp) is digits only
# and at most MAX_RANKS, the trainer's bound on --devices: bash's arithmetic wraps at 2^63 without a
# word ("18446744073709551616" would be 0, then a division by 0), so a count is judged as text first.
MAX_RANKS=1048576
is_count() { [[ $1 =~ ^[1-9][0-9]{0,6}$ ]] && [ "$1" -le $MAX_RANKS ]; }
posint() { is_count "$2" || bad_usage "$1 needs a whole number from 1 to $MAX_RANKS, got '$2'"; }
while [ $# -gt 0 ]; do
    opt=$1 val="" has_val=0
    case $opt in
        --*=*) val=${opt#*=}; opt=${opt%%=*}; has_val=1 ;;
    esac
    case $opt in
        --np | --gpus-per-node | --ranks-per-node | --tp | --dp | --hostfile | --mpi-args)
            if [ $has_val = 0 ]; then
                [ $# -ge 2 ] || bad_usage "$opt needs a value"
                val=$2; shift
            fi
            shift
            case $opt in
                --np) posint "$opt" "$val"; opt_np=$val ;;
                --gpus-per-node) posint "$opt" "$val"; opt_gpus=$val ;;
                --ranks-per-node) posint "$opt" "$val"; opt_rpn=$val ;;
                --tp) posint "$opt" "$val"; opt_tp=$val ;;
                --dp) posint "$opt" "$val"; opt_dp=$val ;;
                --hostfile) [ -n "$val" ] || bad_usage "--hostfile needs a file"; opt_hostfile=$val ;;
                --mpi-args) opt_mpi_args=$val ;;
            esac ;;
        --dry-run) [ $has_val = 0 ] || bad_usage "--dry-run takes no value"; dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; break ;;
        -*) bad_usage "unknown option '$1'" ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || bad_usage "no program to run"
prog=("$@")

if [ $dry_run = 0 ] && ! command -v mpirun >/dev/null 2>&1; then
    die "mpirun not found: apt-get install openmpi-bin libopenmpi-dev"
fi

# ---- Slurm hostlists, expanded in bash: node[01-03,07],gpu5 -> node01 node02 node03 node07 gpu5
# hl_split LIST: hl_items = the comma-separated items, the commas inside [...] kept; 1 if unbalanced
hl_split() {
    local s=$1 cur="" depth=0 c i
    hl_items=()
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
            '[') depth=$((depth + 1)); cur+=$c ;;
            ']') depth=$((depth - 1)); [ $depth -ge 0 ] || return 1; cur+=$c ;;
            ',') if [ $depth = 0 ]; then [ -z "$cur" ] || hl_items+=("$cur"); cur=""; else cur+=$c; fi ;;
            *) cur+=$c ;;
        esac
    done
    [ $depth = 0 ] || return 1
    [ -z "$cur" ] || hl_items+=("$cur")
}
# hl_expand DONE REST: appends DONE + each expansion of REST (which may hold several [...]) to
# hl_hosts; 1 when REST is not a hostlist this understands (nested brackets, letters in a range)
hl_expand() {
    local done=$1 rest=$2 pre after inside tail range lo hi n num
    local -a ranges
    if [[ $rest != *'['* ]]; then
        [[ $rest != *']'* ]] || return 1
        hl_hosts+=("$done$rest")
        return 0
    fi
    pre=${rest%%'['*} after=${rest#*'['}
    inside=${after%%']'*} tail=${after#*']'}
    [[ $pre != *']'* && $inside != *'['* && -n $inside ]] || return 1
    IFS=, read -r -a ranges <<<"$inside"
    for range in "${ranges[@]}"; do
        if [[ $range =~ ^([0-9]+)-([0-9]+)$ ]]; then
            lo=${BASH_REMATCH[1]} hi=${BASH_REMATCH[2]}
        elif [[ $range =~ ^[0-9]+$ ]]; then
            lo=$range hi=$range
        else
            return 1
        fi
        [ $((10#$lo)) -le $((10#$hi)) ] || return 1
        for ((n = 10#$lo; n <= 10#$hi; n++)); do
            printf -v num '%0*d' "${#lo}" "$n"   # the width of the first number: 01-03, 8-10
            hl_expand "$done$pre$num" "$tail" || return 1
        done
    done
}
# expand_hostlist LIST: hosts = the host names (scontrol only for what bash cannot expand)
expand_hostlist() {
    local item
    hl_hosts=()
    if hl_split "$1"; then
        for item in "${hl_items[@]}"; do
            hl_expand "" "$item" || { hl_hosts=(); break; }
        done
    fi
    if [ ${#hl_hosts[@]} = 0 ]; then
        command -v scontrol >/dev/null 2>&1 || die "cannot expand the Slurm nodelist '$1' (and no scontrol)"
        mapfile -t hl_hosts < <(scontrol show hostnames "$1")
        [ ${#hl_hosts[@]} -gt 0 ] || die "scontrol show hostnames '$1' gave no hosts"
    fi
    hosts=("${hl_hosts[@]}")
}

# read_hostfile FILE PBS: hosts and slots (per host, in order of first appearance, repeated lines
# added up). A hostfile line is "host" or "host slots=N"; in PBS's nodefile each line is a slot.
# have_slots=1 when the file gave slot counts (PBS: always; a hostfile: some line had slots=).
read_hostfile() {
    local file=$1 pbs=$2 line host field n i
    local -a fields
    [ -e "$file" ] || die "hostfile '$file' not found"
    if [ ! -f "$file" ] || [ ! -r "$file" ]; then die "cannot read the hostfile '$file'"; fi
    hosts=() slots=() have_slots=$pbs
    while IFS= read -r line || [ -n "$line" ]; do
        if [[ $line =~ ^#[[:space:]]*launch.sh\ mpirun\ options:(.*)$ ]]; then
            file_mpi_args+="${file_mpi_args:+ }${BASH_REMATCH[1]# }"
        fi
        line=${line%%#*}
        read -r -a fields <<<"$line"
        [ ${#fields[@]} -gt 0 ] || continue
        host=${fields[0]} n=1
        for field in "${fields[@]:1}"; do
            case $field in
                slots=*)
                    n=${field#slots=}
                    is_count "$n" || die "hostfile '$file': bad '$field' for $host (slots: 1 to $MAX_RANKS)"
                    have_slots=1 ;;
            esac
        done
        for i in "${!hosts[@]}"; do
            if [ "${hosts[$i]}" = "$host" ]; then slots[i]=$((slots[i] + n)); continue 2; fi
        done
        hosts+=("$host") slots+=("$n")
    done <"$file"
    [ ${#hosts[@]} -gt 0 ] || die "hostfile '$file' names no host (only blank lines and comments)"
}

# ---- 1. where: hosts (and, when the scheduler or the file says, slots per host)
hosts=() slots=() have_slots=0 slot_rule="" local_run=0 file_mpi_args=""
slurm_list=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}
if [ -n "$opt_hostfile" ]; then
    read_hostfile "$opt_hostfile" 0
    where="hostfile ($opt_hostfile, from --hostfile: ${#hosts[@]} host$([ ${#hosts[@]} = 1 ] || echo s))"
    slot_rule="slots: the hostfile's slots="
elif [ -n "${SLURM_JOB_ID:-}" ] && [ -n "$slurm_list" ]; then
    expand_hostlist "$slurm_list"
    listvar=SLURM_JOB_NODELIST; [ -n "${SLURM_JOB_NODELIST:-}" ] || listvar=SLURM_NODELIST
    where="Slurm (job $SLURM_JOB_ID, $listvar=$slurm_list: ${#hosts[@]} host$([ ${#hosts[@]} = 1 ] || echo s))"
    if [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then
        is_count "$SLURM_NTASKS_PER_NODE" || die "SLURM_NTASKS_PER_NODE='$SLURM_NTASKS_PER_NODE' is not a count from 1 to $MAX_RANKS"
        for _ in "${hosts[@]}"; do slots+=("$SLURM_NTASKS_PER_NODE"); done
        have_slots=1 slot_rule="slots: SLURM_NTASKS_PER_NODE=$SLURM_NTASKS_PER_NODE"
    elif [ -n "${SLURM_TASKS_PER_NODE:-}" ]; then
        # "2(x3),1": 2 on each of the first three hosts, 1 on the fourth
        tpn=() ok=1
        IFS=, read -r -a tpn_items <<<"$SLURM_TASKS_PER_NODE"
        for item in "${tpn_items[@]}"; do
            each="" times=""
            [[ $item =~ ^([0-9]+)\(x([0-9]+)\)$ ]] && each=${BASH_REMATCH[1]} times=${BASH_REMATCH[2]}
            if [ -n "$each" ] && is_count "$each" && is_count "$times" && [ "$times" -le ${#hosts[@]} ]; then
                for ((k = 0; k < times; k++)); do tpn+=("$each"); done
            elif is_count "$item"; then
                tpn+=("$item")
            else
                ok=0
            fi
        done
        if [ $ok = 1 ] && [ ${#tpn[@]} = ${#hosts[@]} ]; then
            slots=("${tpn[@]}") have_slots=1 slot_rule="slots: SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE"
        fi
    fi
elif [ -n "${PBS_JOBID:-}" ] && [ -n "${PBS_NODEFILE:-}" ]; then
    read_hostfile "$PBS_NODEFILE" 1
    where="PBS (job $PBS_JOBID, PBS_NODEFILE=$PBS_NODEFILE: ${#hosts[@]} host$([ ${#hosts[@]} = 1 ] || echo s))"
    slot_rule="slots: the PBS_NODEFILE's lines per host"
elif [ -n "${HOSTFILE:-}" ]; then
    read_hostfile "$HOSTFILE" 0
    where="hostfile ($HOSTFILE, from HOSTFILE: ${#hosts[@]} host$([ ${#hosts[@]} = 1 ] || echo s))"
    slot_rule="slots: the hostfile's slots="
else
    local_run=1
    hosts=("${HOSTNAME:-localhost}")
fi
ncores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
[ $local_run = 1 ] && where="one machine (${hosts[0]}, $ncores cores)"
nhosts=${#hosts[@]}

# ---- 2. ranks per host: explicit, else one per GPU, else the scheduler's slots, else CPU ranks
gpus=0 gpu_rule="" gpus_hidden=0
if [ -n "$opt_gpus" ]; then
    gpus=$opt_gpus gpu_rule="--gpus-per-node $opt_gpus"
elif is_count "${SLURM_GPUS_ON_NODE:-}"; then
    gpus=$SLURM_GPUS_ON_NODE gpu_rule="SLURM_GPUS_ON_NODE=$SLURM_GPUS_ON_NODE"
elif [ -n "${SLURM_GPUS_PER_NODE:-}" ] && g=${SLURM_GPUS_PER_NODE%%(*} && g=${g##*:} && is_count "$g"; then
    gpus=$g gpu_rule="SLURM_GPUS_PER_NODE=$SLURM_GPUS_PER_NODE"   # 4, gpu:4 or gpu:a100:4
elif [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    case $CUDA_VISIBLE_DEVICES in
        "" | -1 | NoDevFiles) gpus_hidden=1 ;;   # CUDA sees no GPU: CPU ranks
        *) IFS=, read -r -a devs <<<"$CUDA_VISIBLE_DEVICES"
           for d in "${devs[@]}"; do [ -z "$d" ] || gpus=$((gpus + 1)); done
           gpu_rule="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" ;;
    esac
elif command -v nvidia-smi >/dev/null 2>&1; then
    while IFS= read -r line; do
        [[ $line == GPU\ * ]] && gpus=$((gpus + 1))
    done < <(nvidia-smi -L 2>/dev/null)
    [ $gpus = 0 ] || gpu_rule="nvidia-smi -L lists $gpus"
fi

if [ -n "$opt_rpn" ]; then
    rule="--ranks-per-node $opt_rpn"
    slots=(); for _ in "${hosts[@]}"; do slots+=("$opt_rpn"); done
elif [ "$gpus" -gt 0 ]; then
    rule="GPUs: $gpu_rule"
    slots=(); for _ in "${hosts[@]}"; do slots+=("$gpus"); done
elif [ "$have_slots" = 1 ]; then
    rule=$slot_rule
elif [ "$nhosts" -gt 1 ]; then
    rule="CPU: no GPU, default 1 rank per host"
    slots=(); for _ in "${hosts[@]}"; do slots+=(1); done
else
    if [ -n "$opt_np" ]; then n1=$opt_np rule="CPU: no GPU, --np $opt_np on one machine"
    else n1=2 rule="CPU: no GPU, default 2 ranks on one machine"; fi
    slots=("$n1")
fi
[ $gpus_hidden = 1 ] && [ -z "$opt_rpn" ] && rule+="; CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES}' hides the GPUs"
total=0
for s in "${slots[@]}"; do total=$((total + s)); done
[ "$total" -le $MAX_RANKS ] || die "the hosts' slots add up to $total ranks, more than $MAX_RANKS"
np=$total
per=${slots[0]}
for s in "${slots[@]}"; do [ "$s" = "${slots[0]}" ] || { per=$(IFS=+; echo "${slots[*]}"); break; }; done
ranks_line="$np ranks = $nhosts host$([ "$nhosts" = 1 ] || echo s) x $per per host ($rule)"
if [ -n "$opt_np" ] && [ "$opt_np" != "$total" ]; then
    np=$opt_np
    ranks_line="$np ranks = $nhosts host$([ "$nhosts" = 1 ] || echo s) x $per per host, --np $opt_np sets the total ($rule)"
fi

# ---- 3. the mesh convenience: --tp/--dp must multiply (with the program's --pp, --cp) to the ranks
if [ -n "$opt_tp" ] || [ -n "$opt_dp" ]; then
    other=1 other_desc=""
    for ((i = 1; i < ${#prog[@]}; i++)); do
        case ${prog[i]} in
            --pp | --cp) v=${prog[i + 1]:-}
                is_count "$v" || die "the program's ${prog[i]} '$v' is not a count from 1 to $MAX_RANKS"
                other=$((other * v)) other_desc+=" x ${prog[i]} $v" ;;
        esac
    done
    tp=${opt_tp:-1}
    if [ -z "$opt_dp" ]; then
        [ $((np % (tp * other))) = 0 ] ||
            die "--tp $tp$other_desc does not divide $np ranks"
    elif [ $((opt_dp * tp * other)) != "$np" ]; then
        die "--dp $opt_dp x --tp $tp$other_desc = $((opt_dp * tp * other)), not the $np ranks"
    fi
    [ -z "$opt_tp" ] || prog+=(--tp "$opt_tp")
    [ -z "$opt_dp" ] || prog+=(--dp "$opt_dp")
fi

# ---- 4. the mpirun line
cmd=(mpirun -np "$np")
if [ $local_run = 1 ]; then
    [ "$np" -le "$ncores" ] || cmd+=(--oversubscribe)
else
    [ "$np" -le "$total" ] || cmd+=(--oversubscribe)
    hostarg=""
    for i in "${!hosts[@]}"; do hostarg+="${hostarg:+,}${hosts[i]}:${slots[i]}"; done
    cmd+=(--host "$hostarg")
fi
if [ -n "$file_mpi_args" ]; then      # what a cluster needs to reach its hosts (scripts/cluster.sh)
    read -r -a extra <<<"$file_mpi_args"
    cmd+=("${extra[@]}")
fi
if [ -n "$opt_mpi_args" ]; then
    read -r -a extra <<<"$opt_mpi_args"
    cmd+=("${extra[@]}")
fi
cmd+=("${prog[@]}")

# quote WORD...: the words as a shell would need them typed
quote() {
    local w out=""
    for w in "$@"; do
        if [[ -z $w || $w =~ [^A-Za-z0-9_@%+=:,./-] ]]; then w="'${w//\'/\'\\\'\'}'"; fi
        out+="${out:+ }$w"
    done
    printf '%s\n' "$out"
}
echo "launch: $where"
echo "launch: $ranks_line"
[ -z "$file_mpi_args" ] || echo "launch: the hostfile's mpirun options: $file_mpi_args"
if [ "${EUID:-$(id -u)}" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    echo "launch: as root: exported OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
fi
echo "launch: $(quote "${cmd[@]}")"
[ $dry_run = 0 ] || exit 0
exec "${cmd[@]}"
