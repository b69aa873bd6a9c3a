// The test suites' MPI ranks wait by sleeping, not spinning (test/run_tests.sh preloads this into
// every rank that mpirun starts; nothing else uses it).
//
// make test runs its suites in three lanes on a 2-core machine, so an MPI job's ranks share the
// cores with each other and with the other lanes. A rank that waits for a message polls Open MPI's
// shared-memory transport in a loop, calling sched_yield() between polls (mpi_yield_when_idle).
// sched_yield() hardly gives the core away when the other runnable process is busy: the waiting
// rank keeps most of its time slice, and the rank it waits for runs slower. tensor-parallel took
// 26 s alone and 150 s beside the nvcc suite.
//
// Here sched_yield() sleeps 50 microseconds instead: the waiting rank leaves the core to the one
// that computes. A message then arrives up to 50 us later than it could, which the tiny test
// models do not notice. Results are unchanged (only the timing of the polls is); benchmarks and
// labs run without it.
#include <time.h>

int sched_yield(void) {
    struct timespec pause = {0, 50 * 1000};
    nanosleep(&pause, 0);
    return 0;
}
