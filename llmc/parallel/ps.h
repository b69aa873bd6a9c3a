// Synchronous parameter server (Li et al., 2014), the lecture's first data-parallel design.
// Every rank is a worker; ranks 0 .. S-1 of the data-parallel group are also servers. The flat
// parameter vector (Psi elements) is split into S slices (the balanced split of comm.h);
// server s owns slice s: it alone keeps that slice's optimizer state and updates it.
//
//   1. workers compute gradients (the full flat gradient buffer, as in naive DP)
//   2. push:   each worker sends slice s of its gradients to server s; the server sums them
//   3. update: each server averages its slice and runs AdamW on it (the gradient norm for
//              clipping: the servers' squared norms are summed, one small all-reduce)
//   4. pull:   each server sends its updated parameter slice to every worker
//
// Traffic per step (a bytes per element):
//   server: receives (N-1) a Psi/S (push) and sends (N-1) a Psi/S (pull)
//   worker: sends a Psi minus its own slice (push) and receives as much (pull)
// With S = 1 the server's link carries 2 (N-1) a Psi while a worker's carries 2 a Psi: the
// server is the bottleneck, and it grows with N. The counters in the summary show it.
// Memory: servers hold K Psi/S optimizer bytes, the other ranks none.
//
// The push and pull run in p-1 rounds, at round k rank r sends to r+k and receives from r-k
// (the schedule of llmc/comm/ps.h), so no two ranks ever wait on each other in a cycle.
#pragma once

#include "dp_core.h"

// push: server slices of `grads` receive the sum over workers, then the average
static inline void ps_push_gradients(Comm* c, floatX* grads, size_t count, int S) {
    int p = c->size, r = c->rank;
    CommType t = COMM_FLOATX;
    size_t mine = r < S ? comm_block_count(count, S, r) : 0;
    floatX* slice = r < S ? grads + comm_block_offset(count, S, r) : NULL;
    floatX* inc = (floatX*)device_malloc((mine ? mine : 1) * sizeof(floatX));
    for (int k = 1; k < p; k++) {
        int dst = (r + k) % p, src = (r - k + p) % p;
        bool out = dst < S, in = r < S;
        const floatX* o = out ? grads + comm_block_offset(count, S, dst) : NULL;
        size_t no = out ? comm_block_count(count, S, dst) : 0;
        if (out && in) { comm_sendrecv(c, o, no, dst, inc, mine, src, t); }
        else if (out) { comm_send(c, o, no, t, dst); }
        else if (in) { comm_recv(c, inc, mine, t, src); }
        if (in) { comm_reduce_local(slice, inc, mine, t, COMM_SUM); }
    }
    if (r < S) { comm_avg_finish(slice, mine, t, COMM_AVG, p); }
    device_free(inc);
}

// pull: every rank receives every server's (updated) slice of `params`
static inline void ps_pull_parameters(Comm* c, floatX* params, size_t count, int S) {
    int p = c->size, r = c->rank;
    CommType t = COMM_FLOATX;
    size_t mine = r < S ? comm_block_count(count, S, r) : 0;
    floatX* slice = r < S ? params + comm_block_offset(count, S, r) : NULL;
    for (int k = 1; k < p; k++) {
        int dst = (r + k) % p, src = (r - k + p) % p;
        bool out = r < S, in = src < S;
        floatX* i = in ? params + comm_block_offset(count, S, src) : NULL;
        size_t ni = in ? comm_block_count(count, S, src) : 0;
        if (out && in) { comm_sendrecv(c, slice, mine, dst, i, ni, src, t); }
        else if (out) { comm_send(c, slice, mine, t, dst); }
        else if (in) { comm_recv(c, i, ni, t, src); }
    }
}

// bytes rank r sends in one push + pull (what the counters must show)
static inline uint64_t ps_bytes_sent(size_t count, int p, int r, int S) {
    uint64_t n = 0;
    for (int s = 0; s < S; s++) { if (s != r) { n += comm_block_count(count, S, s); } }   // push
    if (r < S) { n += (uint64_t)(p - 1) * comm_block_count(count, S, r); }                // pull
    return n * sizeof(floatX);
}
static inline uint64_t ps_bytes_received(size_t count, int p, int r, int S) {
    uint64_t n = 0;
    if (r < S) { n += (uint64_t)(p - 1) * comm_block_count(count, S, r); }                // push
    for (int s = 0; s < S; s++) { if (s != r) { n += comm_block_count(count, S, s); } }   // pull
    return n * sizeof(floatX);
}
