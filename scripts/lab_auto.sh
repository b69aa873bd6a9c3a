#!/usr/bin/env bash
# The tuner lab (doc/collectives.md, "Which algorithm when: auto"), after the lecture's cost of
# each all-reduce: alpha log p for recursive doubling, 2 (p-1)/p S beta for the ring and
# Rabenseifner. On RANKS CPU ranks of this machine, for each rank count:
#   1. collbench --autotune: for all-reduce, reduce-scatter, all-gather and broadcast, every size
#      from 4 B to MAXB (x FACTOR), our fastest algorithm measured beside the formulas' choice
#      and, where they differ, the term the formulas leave out; the rows go to one tuning file
#      ($OUT/tuning.txt, rows per rank count);
#   2. one collbench run of the all-reduce: native (MPI's own choice), ring, recursive
#      doubling, Rabenseifner and auto reading that file, the same sizes;
# then scripts/collbench_auto_report.py: per rank count, each algorithm's busbw / MPI's per
# size, auto against the bar (>= 0.95x MPI at every size, >= 1.0x from 1 MiB), the crossovers,
# and the plot $OUT/auto.png. Timings depend on the machine and its load (run it quiet): this is
# a lab, not a test (make test checks that auto's results are bit-exact, test_collectives).
#   RANKS="2 4 8"  MAXB=64M  FACTOR=8  ITERS=0 (collbench -n 0: about 20 ms of calls a round)  ROUNDS=5
#   OUT=build/lab-auto
# Then, as root (CLUSTER=0 skips it): the same on 2 nodes x 2 ranks of scripts/cluster.sh (a 2 Gbit/s
# link between the nodes): the tuning file gets both links and the hierarchical all-reduce among
# the candidates; which sizes the formulas give it, which the measurement, and auto's time there.
# About 6 minutes on 2 cores (8 ranks oversubscribed: they yield when idle).
set -u
cd "$(dirname "$0")/.."
RANKS=${RANKS-2 4 8}   # RANKS="" : the cluster part only
MAXB=${MAXB:-64M}
FACTOR=${FACTOR:-8}
ITERS=${ITERS:-0}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-build/lab-auto}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
make -s collbenchcpu >/dev/null || { echo "error: make collbenchcpu failed (it needs mpicxx: scripts/install_deps.sh)"; exit 1; }
SWEEP="-b 4 -e $MAXB -f $FACTOR -n $ITERS -R $ROUNDS -w 2"
args=()
[ -n "$RANKS" ] && rm -f "$OUT/tuning.txt"
for p in $RANKS; do
    echo "== $p ranks: collbench --autotune (the four primitives), then the all-reduce with auto"
    # shellcheck disable=SC2086
    $MPIRUN -np "$p" ./collbenchcpu --autotune -T "$OUT/tuning.txt" $SWEEP >"$OUT/tune_p$p.txt" 2>&1 ||
        { echo "error: collbench --autotune on $p ranks failed: $(tail -2 "$OUT/tune_p$p.txt")"; exit 1; }
    grep -A 12 -- "--autotune allreduce" "$OUT/tune_p$p.txt" | sed 's/^/    /'
    # shellcheck disable=SC2086
    $MPIRUN -np "$p" ./collbenchcpu -p allreduce -a native,ring,recursive_doubling,rabenseifner,auto -T "$OUT/tuning.txt" -c 0 $SWEEP \
        >"$OUT/allreduce_p$p.txt" 2>&1 || { echo "error: collbench on $p ranks failed: $(tail -2 "$OUT/allreduce_p$p.txt")"; exit 1; }
    args+=("$p=$OUT/allreduce_p$p.txt")
done
if [ ${#args[@]} -gt 0 ]; then
    /usr/bin/python3 scripts/collbench_auto_report.py "$OUT/auto.png" "${args[@]}" | tee "$OUT/report.md"
    echo "tuning file: $OUT/tuning.txt; logs: $OUT/"
fi

if [ "${CLUSTER:-1}" = 1 ] && [ "$(id -u)" = 0 ]; then
    NAME=llmcauto
    trap 'scripts/cluster.sh down --name $NAME >/dev/null 2>&1' EXIT
    scripts/cluster.sh down --name $NAME >/dev/null 2>&1
    scripts/cluster.sh up --name $NAME --subnet 10.213.82 --nodes 2 --ranks-per-node 2 --inter-mbit 2000 >"$OUT/cluster_up.txt" 2>&1 ||
        { echo "error: scripts/cluster.sh up failed: $(tail -2 "$OUT/cluster_up.txt")"; exit 1; }
    LAUNCH="scripts/launch.sh --hostfile build/cluster-$NAME/hosts --np 4 --"
    echo "== 2 nodes x 2 ranks: collbench --autotune, then the all-reduce with auto"
    rm -f "$OUT/tuning_cluster.txt"
    # shellcheck disable=SC2086
    $LAUNCH ./collbenchcpu --autotune -T "$OUT/tuning_cluster.txt" -b 4 -e 16M -f 4 -n 0 -R $ROUNDS -w 2 >"$OUT/tune_cluster.txt" 2>&1 ||
        { echo "error: collbench --autotune on the cluster failed: $(tail -2 "$OUT/tune_cluster.txt")"; exit 1; }
    grep -E "^link|^allreduce" "$OUT/tuning_cluster.txt" | sed 's/^/    /'
    # shellcheck disable=SC2086
    $LAUNCH ./collbenchcpu -p allreduce -a native,ring,recursive_doubling,rabenseifner,hierarchical,auto -T "$OUT/tuning_cluster.txt" -c 0 -b 4 -e 16M -f 4 \
        -n 0 -R $ROUNDS -w 2 >"$OUT/allreduce_cluster.txt" 2>&1 ||
        { echo "error: collbench on the cluster failed: $(tail -2 "$OUT/allreduce_cluster.txt")"; exit 1; }
    /usr/bin/python3 scripts/collbench_auto_report.py "$OUT/auto_cluster.png" "4=$OUT/allreduce_cluster.txt" | tee "$OUT/report_cluster.md"
fi
