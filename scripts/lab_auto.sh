#!/usr/bin/env bash
# The tuner lab (doc/collectives.md, "Which algorithm when: auto"), after the lecture's cost of
# each all-reduce: alpha log p for recursive doubling, 2 (p-1)/p S beta for the ring and
# Rabenseifner. On RANKS CPU ranks of this machine, for each rank count:
#   1. collbench --tune: for all-reduce, reduce-scatter, all-gather and broadcast, every size
#      from 4 B to MAXB (x FACTOR), our fastest algorithm measured beside the formulas' choice
#      and, where they differ, the term the formulas leave out; the rows go to one tuning file
#      ($OUT/tuning.txt, rows per rank count);
#   2. one collbench run of the all-reduce: native (MPI's own choice), ring, recursive
#      doubling, Rabenseifner and auto reading that file, the same sizes;
# then scripts/collbench_auto_report.py: per rank count, each algorithm's busbw / MPI's per
# size, auto against the bar (>= 0.95x MPI at every size, >= 1.0x from 1 MiB), the crossovers,
# and the plot $OUT/auto.png. Timings depend on the machine and its load (run it quiet): this is
# a lab, not a test (make test checks that auto's results are bit-exact, test_collectives).
#   RANKS="2 4 8"  MAXB=64M  FACTOR=8  ITERS=0 (collbench -n 0: about 20 ms of calls a round)  ROUNDS=3
#   OUT=build/lab-auto
# About 5 minutes on 2 cores (8 ranks oversubscribed: they yield when idle).
set -u
cd "$(dirname "$0")/.."
RANKS=${RANKS:-2 4 8}
MAXB=${MAXB:-64M}
FACTOR=${FACTOR:-8}
ITERS=${ITERS:-0}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-build/lab-auto}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
make -s collbenchcpu >/dev/null || { echo "error: make collbenchcpu failed (it needs mpicxx: scripts/install_deps.sh)"; exit 1; }
SWEEP="-b 4 -e $MAXB -f $FACTOR -n $ITERS -R $ROUNDS -w 2"
rm -f "$OUT/tuning.txt"
args=()
for p in $RANKS; do
    echo "== $p ranks: collbench --tune (the four primitives), then the all-reduce with auto"
    # shellcheck disable=SC2086
    $MPIRUN -np "$p" ./collbenchcpu --tune "$OUT/tuning.txt" $SWEEP >"$OUT/tune_p$p.txt" 2>&1 ||
        { echo "error: collbench --tune on $p ranks failed: $(tail -2 "$OUT/tune_p$p.txt")"; exit 1; }
    grep -A 12 -- "--tune allreduce" "$OUT/tune_p$p.txt" | sed 's/^/    /'
    # shellcheck disable=SC2086
    $MPIRUN -np "$p" ./collbenchcpu -p allreduce -a native,ring,recursive_doubling,rabenseifner,auto -T "$OUT/tuning.txt" -c 0 $SWEEP \
        >"$OUT/allreduce_p$p.txt" 2>&1 || { echo "error: collbench on $p ranks failed: $(tail -2 "$OUT/allreduce_p$p.txt")"; exit 1; }
    args+=("$p=$OUT/allreduce_p$p.txt")
done
/usr/bin/python3 scripts/collbench_auto_report.py "$OUT/auto.png" "${args[@]}" | tee "$OUT/report.md"
echo "tuning file: $OUT/tuning.txt; logs: $OUT/"
