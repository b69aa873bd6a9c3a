// The cp group's communication: every call waits for the compute stream's work so far, is timed
// into cp->seconds and cp->calls and traced (track 4); with use_ring the collectives are ours
// (llmc/comm/ring.h, alltoall.h), whose bytes the communicator counts, else the native ones.
#pragma once

#include "cp_core.h"

static inline void cp_comm_ready(ContextParallel* cp) {   // the cp stream waits for the compute so far
    backend_event_record(cp->ready);
    comm_wait_event(cp->comm, cp->ready);
}
static inline void cp_end_call(ContextParallel* cp, const char* name, double t0) {
    cp->seconds += trace_now() - t0;
    cp->calls++;
    trace_event(name, 4, t0);
}
// mine: n elements -> all: every rank's n, in rank order (the collectives take the total count)
static inline void cp_allgather(ContextParallel* cp, const char* name, const void* mine, void* all, size_t n, CommType t) {
    cp_comm_ready(cp);
    double t0 = trace_now();
    size_t total = n * cp->cp;
    if (cp->use_ring) { allgather_ring(cp->comm, mine, all, total, t); } else { allgather_native(cp->comm, mine, all, total, t); }
    cp_end_call(cp, name, t0);
}
// all: cp blocks of n elements -> mine: block `rank`, summed over the ranks
static inline void cp_reduce_scatter(ContextParallel* cp, const char* name, const void* all, void* mine, size_t n, CommType t) {
    cp_comm_ready(cp);
    double t0 = trace_now();
    size_t total = n * cp->cp;
    if (cp->use_ring) { reduce_scatter_ring(cp->comm, all, mine, total, t, COMM_SUM); }
    else { reduce_scatter_native(cp->comm, all, mine, total, t, COMM_SUM); }
    cp_end_call(cp, name, t0);
}
static inline void cp_alltoall(ContextParallel* cp, const char* name, const floatX* send, floatX* recv, size_t n) {
    cp_comm_ready(cp);
    double t0 = trace_now();
    if (cp->use_ring) { alltoall_pairwise(cp->comm, send, recv, n, COMM_FLOATX); }
    else { alltoall_native(cp->comm, send, recv, n, COMM_FLOATX); }
    cp_end_call(cp, name, t0);
}
// ring step: post the messages (to r+1, from r-1) and return; cp_ring_wait completes them
static inline void cp_ring_post(ContextParallel* cp, CommPending* p, const CommMsg* msgs, int n, CommType t) {
    cp_comm_ready(cp);
    double t0 = trace_now();
    comm_exchange_start(cp->comm, msgs, n, t, p);
    cp->seconds += trace_now() - t0;
}
static inline void cp_ring_wait(ContextParallel* cp, CommPending* p, const char* name) {
    double t0 = trace_now();   // only the wait the computation did not hide
    comm_exchange_finish(p);
    cp_end_call(cp, name, t0);
}
