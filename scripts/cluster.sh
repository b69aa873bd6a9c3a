#!/usr/bin/env bash
# Several "nodes" on one machine: each node a Linux network namespace, the link between nodes
# rate-limited, so that the multi-node paths (scripts/launch.sh --hostfile, hierarchical
# collectives, TP inside a node and DP or PP across) run for real and the node boundary costs
# what it costs on a cluster (doc/cluster.md).
#
#   root namespace (this machine)                       node k = namespace NAME-nodeK
#   +--------------------------------------+            +-----------------------------------+
#   | mpirun           bridge NAME-br      |   veth     | eth0  SUBNET.(k+1)                |
#   |   (launch.sh)    SUBNET.254  --------+- NAME-k ---+ (rate limited both ways: tbf)     |
#   |                                      |            | ranks: shared memory among them,  |
#   +--------------------------------------+            | TCP to other nodes; own hostname  |
#                                                       | and own /dev/shm                  |
#                                                       +-----------------------------------+
# A message between nodes leaves node j through its eth0 (rate R), crosses the bridge and
# enters node k through NAME-k (rate R): the inter-node link is R each way. Inside a node Open
# MPI uses shared memory, as between the GPUs of one real node (vader here, NVLink there).
#
# mpirun reaches a node as it reaches a real host, through its remote-shell agent: instead of
# ssh, build/cluster/rsh enters the node's namespace (ip netns exec), gives the node a hostname
# and a /dev/shm of its own (unshare: Open MPI names its shared-memory files after the host), and
# runs the command there. The hostfile build/cluster/hosts lists the nodes by address, with a
# comment line "# launch.sh mpirun options: ..." that scripts/launch.sh adds to the mpirun line.
#
#   scripts/cluster.sh up [--nodes N] [--ranks-per-node R] [--inter-mbit M] [--name NAME] [--subnet A.B.C]
#   scripts/cluster.sh status [--name NAME]
#   scripts/cluster.sh down [--name NAME]
#     --nodes N            nodes (default 2)
#     --ranks-per-node R   the hostfile's slots per node (default 2)
#     --inter-mbit M       the inter-node rate in Mbit/s each way (default 2000: about 10x slower
#                          than shared memory on a laptop; 0 = no limit, TCP over veth)
#     --name NAME          prefix of everything made (default llmc; the tests use their own)
#     --subnet A.B.C       the nodes' /24 (default 10.213.77; must be unused on this machine)
#   then:  scripts/launch.sh --hostfile build/cluster/hosts --np 4 -- ./train_gpt2cpu --threads 1 --tp 2
# Needs root (or sudo without a password) and iproute2 (ip, tc) and util-linux (unshare); so do
# the jobs on the cluster (mpirun enters the nodes' namespaces: sudo -E scripts/launch.sh ...).
# Touches nothing that exists: it adds a bridge, veth pairs and namespaces, all named NAME-*,
# and the files of build/cluster (build/cluster-NAME for another name); down removes them, as
# does a failed or interrupted up. An up or down of one name waits for another one running (a lock:
# /run/lock/llmc-cluster-NAME.lock), so two at once never leave half a cluster. Numbers are digits
# only and bounded (--nodes 1-200, --ranks-per-node 1-1024, --inter-mbit 0-10^6).
set -u
cd "$(dirname "$0")/.." || exit 1

usage() {
    echo "usage: scripts/cluster.sh up [--nodes N] [--ranks-per-node R] [--inter-mbit M] [--name NAME] [--subnet A.B.C]"
    echo "       scripts/cluster.sh status|down [--name NAME]"
}
die() { echo "cluster: $*" >&2; exit 1; }
bad_usage() { echo "cluster: $*" >&2; usage >&2; exit 2; }

[ $# -ge 1 ] || bad_usage "say up, status or down"
action=$1; shift
case $action in up | down | status) ;; -h | --help) usage; exit 0 ;; *) bad_usage "unknown action '$action'" ;; esac
nodes=2 rpn=2 mbit=2000 name=llmc subnet=10.213.77
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || bad_usage "$1 needs a value"
    case $1 in
        --nodes) nodes=$2 ;;
        --ranks-per-node) rpn=$2 ;;
        --inter-mbit) mbit=$2 ;;
        --name) name=$2 ;;
        --subnet) subnet=$2 ;;
        *) bad_usage "unknown option '$1'" ;;
    esac
    shift 2
done
# numbers judged as text first (digits only, no leading zero, bounded), before bash's arithmetic,
# which wraps at 2^63 without a word: count VALUE MOST
count() { [[ $1 =~ ^(0|[1-9][0-9]{0,6})$ ]] && [ "$1" -le "$2" ]; }
{ count "$nodes" 200 && [ "$nodes" -ge 1 ]; } || bad_usage "--nodes must be 1 to 200, got '$nodes'"
{ count "$rpn" 1024 && [ "$rpn" -ge 1 ]; } || bad_usage "--ranks-per-node must be 1 to 1024, got '$rpn'"
count "$mbit" 1000000 || bad_usage "--inter-mbit must be 0 to 1000000 Mbit/s (0: no limit), got '$mbit'"
[[ $name =~ ^[a-z][a-z0-9]{0,7}$ ]] || bad_usage "--name must be 1-8 lower-case letters and digits, got '$name'"
octets=""
[[ $subnet =~ ^(10|172|192)\.([0-9]{1,3})\.([0-9]{1,3})$ ]] && octets="${BASH_REMATCH[2]} ${BASH_REMATCH[3]}"
{ [ -n "$octets" ] && count "${octets% *}" 255 && count "${octets#* }" 255; } ||
    bad_usage "--subnet must be a private A.B.C, B and C 0 to 255 (the nodes get A.B.C.1, ...), got '$subnet'"

dir=build/cluster
[ "$name" = llmc ] || dir=build/cluster-$name

# root, or re-run under password-less sudo
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        exec sudo -n -- "$0" "$action" --nodes "$nodes" --ranks-per-node "$rpn" --inter-mbit "$mbit" --name "$name" --subnet "$subnet"
    fi
    die "network namespaces need root: run 'sudo scripts/cluster.sh $action ...' (or as root)"
fi
for tool in ip tc unshare flock; do
    command -v $tool >/dev/null 2>&1 || die "'$tool' not found: apt-get install iproute2 util-linux"
done
# up and down of one name, one at a time: two ups at once would both find no cluster, both start
# making one, and the one that failed would remove, in its clean-up, what the other made (half a
# cluster). The second waits for the first (at most 5 minutes), then finds the cluster up (or gone).
# (The namespaces are the machine's, so is the lock: /run/lock, else /tmp; every checkout shares it.)
if [ "$action" != status ]; then
    lock=/run/lock/llmc-cluster-$name.lock
    [ -d /run/lock ] && [ -w /run/lock ] || lock=/tmp/llmc-cluster-$name.lock
    exec 9>"$lock"
    if ! flock -n 9; then
        echo "cluster '$name': another 'cluster.sh up/down' of this name is running; waiting for it" >&2
        flock -w 300 9 || die "cluster '$name': another 'cluster.sh up/down' still holds $lock after 5 minutes"
    fi
fi

# the namespaces of this cluster, whatever their number (from ip netns, not from our files)
cluster_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-node[0-9]+$" | sort -V; }

down() {
    local ns pids k
    for ns in $(cluster_namespaces); do
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
        # shellcheck disable=SC2086  # one argument per process
        [ -z "$pids" ] || kill -9 $pids 2>/dev/null
        k=${ns##*-node}
        ip link del "$name-$k" 2>/dev/null   # the veth pair goes with either end
        ip netns del "$ns" 2>/dev/null
    done
    for k in $(ip -o link show 2>/dev/null | grep -oE " $name-[0-9]+[@:]" | tr -d ' @:'); do ip link del "$k" 2>/dev/null; done
    ip link del "$name-br" 2>/dev/null
    rm -rf "$dir"
}

status() {
    local ns k addr q qin
    if [ -z "$(cluster_namespaces)" ]; then echo "cluster '$name': down"; return 1; fi
    echo "cluster '$name': $(cluster_namespaces | wc -l) nodes, hostfile $dir/hosts"
    echo "  launcher (this namespace): $(ip -o -4 addr show dev "$name-br" 2>/dev/null | awk '{print $4}') on bridge $name-br"
    for ns in $(cluster_namespaces); do
        k=${ns##*-node}
        addr=$(ip netns exec "$ns" ip -o -4 addr show dev eth0 2>/dev/null | awk '{print $4}')
        q=$(ip netns exec "$ns" tc qdisc show dev eth0 2>/dev/null | grep -o 'rate [^ ]*' | head -1)
        qin=$(tc qdisc show dev "$name-$k" 2>/dev/null | grep -o 'rate [^ ]*' | head -1)
        echo "  $ns: eth0 $addr, out ${q:-no limit}, in ${qin:-no limit};" \
             "processes: $(ip netns pids "$ns" 2>/dev/null | wc -l)"
    done
}

case $action in
    down) if [ -z "$(cluster_namespaces)" ] && ! ip link show "$name-br" >/dev/null 2>&1; then
              rm -rf "$dir"; echo "cluster '$name': nothing to remove"
          else
              down; echo "cluster '$name': removed (namespaces, links, $dir)"
          fi
          exit 0 ;;
    status) status; exit $? ;;
esac

# ---- up
[ -z "$(cluster_namespaces)" ] || die "cluster '$name' is already up (scripts/cluster.sh down$([ "$name" = llmc ] || echo " --name $name") first)"
if ip -o -4 addr show 2>/dev/null | grep -q " inet $subnet\." || ip -4 route show 2>/dev/null | grep -q "^$subnet\."; then
    die "the subnet $subnet.0/24 is in use on this machine: choose another with --subnet"
fi
trap 'trap - EXIT; echo "cluster: interrupted, removing what was made" >&2; down; exit 130' INT TERM
# shellcheck disable=SC2154  # rc is the trap's own
trap 'rc=$?; if [ $rc != 0 ]; then echo "cluster: up failed, removing what was made" >&2; down; fi' EXIT
set -e
mkdir -p "$dir"
# tbf: at most M Mbit/s; a bucket of 1 ms of traffic (at least 64 KiB) lets bursts through at
# the wire's pace, a queue of 20 ms before it drops
limit() {   # limit NS DEV
    [ "$mbit" != 0 ] || return 0
    local burst=$(( mbit * 1000000 / 8 / 1000 ))
    [ $burst -ge 65536 ] || burst=65536
    if [ -n "$1" ]; then ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "${mbit}mbit" burst "$burst" latency 20ms
    else tc qdisc replace dev "$2" root tbf rate "${mbit}mbit" burst "$burst" latency 20ms; fi
}
ip link add "$name-br" type bridge
ip addr add "$subnet.254/24" dev "$name-br"
ip link set "$name-br" up
for ((k = 0; k < nodes; k++)); do
    ns=$name-node$k
    ip netns add "$ns"
    ip link add "$name-$k" type veth peer name "$name-${k}n"
    ip link set "$name-${k}n" netns "$ns"
    ip netns exec "$ns" ip link set "$name-${k}n" name eth0
    ip netns exec "$ns" ip addr add "$subnet.$((k + 1))/24" dev eth0
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip link set eth0 up
    # IPv4 only: Open MPI would otherwise open a second TCP path over the link-local IPv6 address
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
    ip link set "$name-$k" master "$name-br" up
    limit "$ns" eth0        # out of node k
    limit "" "$name-$k"     # into node k
done

# the remote-shell agent: mpirun calls it as ssh, "rsh [options] HOST COMMAND..."
cases=""
for ((k = 0; k < nodes; k++)); do cases+="    $subnet.$((k + 1)) | $name-node$k) ns=$name-node$k ;;"$'\n'; done
cat >"$dir/rsh.tmp" <<EOF
#!/usr/bin/env bash
# made by scripts/cluster.sh up: mpirun's remote shell into the nodes of cluster '$name'
while [[ \${1:-} == -* ]]; do shift; done   # ssh options mpirun may pass (-x)
host=\${1:-}; shift
if [ "\$(id -u)" != 0 ]; then
    echo "cluster rsh: entering node '\$host' needs root: run the job as root (sudo -E scripts/launch.sh ...)" >&2
    exit 255
fi
case \$host in
$cases    *) echo "cluster rsh: no node '\$host' in cluster '$name'" >&2; exit 255 ;;
esac
# a hostname and a /dev/shm of its own, as on a separate machine, then the command
exec ip netns exec "\$ns" unshare --uts --mount /bin/sh -c 'hostname "\$0" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec /bin/sh -c "\$1"' "\$ns" "\$*"
EOF
chmod +x "$dir/rsh.tmp"
mv "$dir/rsh.tmp" "$dir/rsh"

# the hostfile, with the mpirun options this cluster needs (launch.sh reads that line):
#   plm_rsh_agent          our agent instead of ssh
#   oob/btl_tcp_if_include the daemons and the ranks talk over the cluster's subnet only
#   pml ob1, btl ...       shared memory inside a node, TCP between nodes (no UCX probing)
#   mpi_yield_when_idle 1  a waiting rank yields its core: here the kernel moves the packets on
#                          the same cores (a real NIC does it in hardware), and a rank spinning
#                          at full speed would delay them by a scheduler tick (4 ms)
agent=$PWD/$dir/rsh
{
    echo "# made by: scripts/cluster.sh up --nodes $nodes --ranks-per-node $rpn --inter-mbit $mbit --name $name --subnet $subnet"
    echo "# $nodes nodes (network namespaces $name-node0..$((nodes - 1))), the link between them $([ "$mbit" = 0 ] && echo "not limited" || echo "$mbit Mbit/s each way")"
    echo "# launch.sh mpirun options: --mca plm_rsh_agent $agent --mca oob_tcp_if_include $subnet.0/24" \
         "--mca btl_tcp_if_include $subnet.0/24 --mca pml ob1 --mca osc ^ucx --mca btl self,vader,tcp --mca mpi_yield_when_idle 1"
    for ((k = 0; k < nodes; k++)); do echo "$subnet.$((k + 1)) slots=$rpn"; done
} >"$dir/hosts.tmp"
mv "$dir/hosts.tmp" "$dir/hosts"
set +e
trap - INT TERM EXIT
status
echo "run: scripts/launch.sh --hostfile $dir/hosts --np $((nodes * rpn)) -- ./train_gpt2cpu --threads 1"
