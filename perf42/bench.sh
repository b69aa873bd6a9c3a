#!/usr/bin/env bash
# perf42/bench.sh BIN OUTPREFIX: the all-reduce table on 2, 4, 8 ranks (factor 8 over 4 B..64 MiB, factor 2 over 128 KiB..8 MiB)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
BIN=$1; OUT=$2
MPIRUN="mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"
A=native,ring,rabenseifner,recursive_doubling
for p in ${PS:-2 4 8}; do
  $MPIRUN -np $p $BIN -p allreduce -a $A -b 4 -e 64M -f 8 -c 0 -n ${N:-10} -R 2 > ${OUT}_p${p}_f8.txt 2>&1
  $MPIRUN -np $p $BIN -p allreduce -a $A -b 128K -e 8M -f 2 -c 0 -n ${N:-10} -R 2 > ${OUT}_p${p}_f2.txt 2>&1
done
