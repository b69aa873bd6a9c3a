// comm_check_agree: the algorithm parameters that comm_check_args does not cover (number of
// servers, node size, grid shape) must also be the same on every rank, or the ranks would run
// different schedules and hang. Same switch (c->check_args) and same kind of message.
#pragma once

#include "comm.h"

static inline void comm_check_agree(const Comm* c, const char* call, const char* what, long long mine) {
    if (!c->check_args || c->size == 1) { return; }
    long long lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_LONG_LONG, MPI_MIN, c->mpi);
    MPI_Allreduce(&mine, &hi, 1, MPI_LONG_LONG, MPI_MAX, c->mpi);
    if (lo != hi) {
        comm_die(c, call, "ranks disagree on the %s (this rank passed %lld, values range from %lld to %lld)", what, mine, lo, hi);
    }
}
