#!/usr/bin/env bash
# Smoke test of collbench (dev/collbench/collbench.cu): a short sweep of small sizes with the data check on,
# for every primitive and every algorithm, on 2 and 3 ranks; the total #wrong must be 0.
# Then -L (the links file, one node), --autotune and auto with its file (-T), and bad flags: every rank must print the one-line error
# and the job must fail, not hang.
set -u
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null; then
    echo "skipping collbench: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    exit 0
fi
if [ ! -x ./collbenchcpu ]; then
    echo "FAIL collbenchcpu is not built (make collbenchcpu needs mpicxx)"
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
status=0
PRIMS="allreduce reduce_scatter allgather broadcast reduce gather scatter alltoall"
for p in 2 3; do
    for prim in $PRIMS; do
        out=$(timeout 120 $MPIRUN -np $p ./collbenchcpu -p $prim -a all -b 4 -e 64K -f 8 -n 2 -w 1 -c 1 -r $((p - 1)) -d int32 2>&1)
        rc=$?
        wrong=$(sed -n 's/^# #wrong in total: //p' <<<"$out")
        rows=$(grep -cE '^ +[0-9]+ ' <<<"$out")
        if [ $rc -eq 0 ] && [ "$wrong" = "0" ] && [ "$rows" -gt 0 ]; then
            echo "PASS collbench $prim p=$p: $rows rows, #wrong 0"
        else
            echo "FAIL collbench $prim p=$p: exit status $rc, #wrong '${wrong}'"
            tail -5 <<<"$out"
            status=1
        fi
    done
done
# one more sweep in bf16 with avg, where the reduction rounds
out=$(timeout 120 $MPIRUN -np 3 ./collbenchcpu -p allreduce -b 4 -e 64K -f 16 -n 2 -w 1 -d bf16 -o avg 2>&1)
if [ $? -eq 0 ] && grep -q '^# #wrong in total: 0$' <<<"$out"; then
    echo "PASS collbench allreduce bf16 avg p=3"
else
    echo "FAIL collbench allreduce bf16 avg p=3"; tail -5 <<<"$out"; status=1
fi

# -L FILE on one node: the planner's links file with the intra line only (no link between nodes
# was measured), written whole (no FILE.tmp left behind)
mkdir -p build/test
links=build/test/collbench_links.txt
rm -f "$links" "$links.tmp"
out=$(timeout 120 $MPIRUN -np 2 ./collbenchcpu -p allreduce -a ring -b 4 -e 64 -f 16 -n 1 -w 0 -R 1 -L "$links" 2>&1)
if [ $? -eq 0 ] && [ -f "$links" ] && [ ! -e "$links.tmp" ] && [ "$(grep -cE '^intra [0-9.]+ [0-9.e+]+$' "$links")" = 1 ] &&
   ! grep -q '^inter' "$links" && grep -q "^# links written to $links" <<<"$out"; then
    echo "PASS collbench -L one node: $(grep '^intra' "$links")"
else
    echo "FAIL collbench -L one node: $(cat "$links" 2>/dev/null | tr '\n' '|') $(tail -3 <<<"$out")"; status=1
fi

# --autotune -T FILE: the tuning file for auto (llmc/comm/tuning.h): the link, a row for each of the four
# (and no word from mpirun, which takes '--tune FILE' for a parameter file of its own: not our flag's name),
# primitives, written whole; a second run on 3 ranks adds its rows and keeps the 2 ranks' ones;
# then auto reads it (-T) and its results are checked as every algorithm's
tune=build/test/collbench_tuning.txt
rm -f "$tune" "$tune.tmp"
out2=$(timeout 120 $MPIRUN -np 2 ./collbenchcpu --autotune -T "$tune" -b 4 -e 64K -f 16 -n 1 -w 0 -R 1 2>&1)
rc2=$?
n2=$(grep -cE '^(allreduce|reduce_scatter|allgather|broadcast) 2 2 ' "$tune" 2>/dev/null)
out3=$(timeout 120 $MPIRUN -np 3 ./collbenchcpu --autotune -T "$tune" -b 4 -e 64K -f 16 -n 1 -w 0 -R 1 2>&1)
rc3=$?
prims=$(grep -oE '^(allreduce|reduce_scatter|allgather|broadcast) 3 3 ' "$tune" 2>/dev/null | sort -u | wc -l)
if [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ ! -e "$tune.tmp" ] && grep -qE '^link intra [0-9.]+ [0-9.e+]+$' "$tune" && [ "$prims" = 4 ] &&
   [ "$(grep -cE '^(allreduce|reduce_scatter|allgather|broadcast) 2 2 ' "$tune")" = "$n2" ] && [ "$n2" -ge 4 ] &&
   grep -q "^# --autotune broadcast on 3 ranks" <<<"$out3" && ! grep -qi "keyval parser\|variable file" <<<"$out3"; then
    echo "PASS collbench --autotune: $n2 rows for 2 ranks kept, rows for all 4 primitives on 3 ranks, the link line"
else
    echo "FAIL collbench --autotune: exit $rc2/$rc3, $n2 rows for 2 ranks, $prims primitives for 3: $(tail -2 <<<"$out3")"; status=1
fi
for prim in allreduce reduce_scatter allgather broadcast; do
    out=$(timeout 120 $MPIRUN -np 3 ./collbenchcpu -p $prim -a auto -T "$tune" -b 4 -e 256K -f 4 -n 1 -w 0 -R 1 -d bf16 2>&1)
    if [ $? -eq 0 ] && grep -q '^# #wrong in total: 0$' <<<"$out"; then
        echo "PASS collbench -a auto -T (the file above) $prim bf16 p=3: #wrong 0"
    else
        echo "FAIL collbench -a auto -T $prim p=3: $(tail -3 <<<"$out")"; status=1
    fi
done
# expect_error NAME PATTERN ARGS...: the job fails, without hanging, and prints PATTERN
expect_error() {
    local name=$1 pattern=$2; shift 2
    local err
    err=$(timeout 60 $MPIRUN -np 2 ./collbenchcpu "$@" 2>&1 >/dev/null)
    local rc=$?
    local n
    n=$(grep -c -- "$pattern" <<<"$err")
    # Flags are checked before MPI_Init, so when the first rank exits mpirun may kill the
    # other before it prints: demand the message from at least one rank, a non-zero exit
    # and no hang.
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -ge 1 ]; then
        echo "PASS collbench $name: $(grep -m1 -- "$pattern" <<<"$err")"
    else
        echo "FAIL collbench $name: exit status $rc, $n ranks printed '$pattern': $(head -3 <<<"$err")"
        status=1
    fi
}
expect_error "unknown flag" "error: \[rank [01]\] collbench: unknown flag '-z'" -z 3
expect_error "bad type" "error: \[rank [01]\] collbench: -d wants float, bf16 or int32, got 'fp64'" -d fp64
expect_error "bad algorithm" "error: \[rank [01]\] collbench: -a: no algorithm 'tree' for allreduce" -p allreduce -a tree
expect_error "root out of range" "error: \[rank [01]\] collbench: -r 2 is out of range for 2 ranks" -p broadcast -r 2
printf 'allreduce 2 2 0 10 - tree\n' >build/test/collbench_bad_tuning.txt
expect_error "a malformed tuning file" "build/test/collbench_bad_tuning.txt: line 1: want 'PRIM RANKS NODE" -a auto -T build/test/collbench_bad_tuning.txt
expect_error "--autotune without -T" "error: \[rank [01]\] collbench: --autotune writes the tuning file -T FILE names" --autotune -b 4 -e 4
expect_error "a missing tuning file" "cannot read the tuning file 'build/test/no_such_tuning.txt'" -a auto -T build/test/no_such_tuning.txt
expect_error "links file in a missing directory" "\[rank 0\] collbench: -L 'build/test/no/such/links.txt': the directory 'build/test/no/such' does not exist" -b 4 -e 4 -L build/test/no/such/links.txt
# the values bounded, the paths checked by their roles (llmc/paths.h), the tuning file read strictly
# and of use to auto on this many ranks (llmc/comm/tuning.h); each error names the rank
expect_error "a factor that makes millions of sizes" "\[rank [01]\] collbench: -b 8 -e 67108864 -f 1.0000001 make 159423860 sizes, more than 1000" -f 1.0000001
expect_error "a size that is not a number" "\[rank [01]\] collbench: -b wants a byte count such as 8, 4K or 64M, got 'nan'" -b nan
expect_error "an infinite size" "\[rank [01]\] collbench: -e wants a byte count such as 8, 4K or 64M, got 'inf'" -e inf
expect_error "a zero size" "\[rank [01]\] collbench: -b 0 is not within 1 byte to 1T" -b 0
expect_error "an infinite factor" "\[rank [01]\] collbench: -f wants a factor > 1, got 'inf'" -f inf
rm -f build/test/collbench_fifo; mkfifo build/test/collbench_fifo
expect_error "a named pipe as the tuning file" "\[rank [01]\] collbench: -T: 'build/test/collbench_fifo' is a named pipe, expected a file" -a auto -T build/test/collbench_fifo
printf 'link intra 5 25\n' >build/test/collbench_links_in.txt
expect_error "the links written over the tuning file" "\[rank [01]\] collbench: -L 'build/test/collbench_links_in.txt' is the same file as the input" -b 4 -e 4 -a auto -L build/test/collbench_links_in.txt -T build/test/collbench_links_in.txt
printf 'link intra 5 25x\n' >build/test/collbench_unit.txt
expect_error "a tuning link with a unit" "\[rank [01]\] comm_tuning_load .*collbench_unit.txt: line 1: want 'link intra|inter" -a auto -T build/test/collbench_unit.txt
printf 'allreduce 2 2 0 10 - ring\nallreduce 2 2 10 99 - ring\n' >build/test/collbench_overlap.txt
expect_error "tuning rows that overlap" "line 2: allreduce on 2 ranks, sizes 10 to 99, overlaps line 1's 0 to 10" -a auto -T build/test/collbench_overlap.txt
: >build/test/collbench_empty.txt
expect_error "an empty tuning file" "\[rank [01]\] comm_tuning_load .*is of no use to auto here: it holds no link and no row" -a auto -T build/test/collbench_empty.txt
printf 'allreduce 4 4 0 10 - ring\n' >build/test/collbench_other_p.txt
expect_error "a tuning file for other rank counts" "it has no row for 2 ranks (rows for 4): measure them with mpirun -np 2" -a auto -T build/test/collbench_other_p.txt
exit $status
