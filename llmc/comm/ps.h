// Parameter-server all-reduce: every rank pushes its data to a server, the server reduces it
// and sends the result back to every rank. With S servers (ranks 0 .. S-1), the buffer is
// split into S slices (the balanced split of comm.h) and server s owns slice s.
//
//   p = 4, S = 1 (rank 0 is the server), data a b c d:
//   push:  1 -> 0 (b)   2 -> 0 (c)   3 -> 0 (d)      server: a+b+c+d
//   pull:  0 -> 1       0 -> 2       0 -> 3          (the sum)
//   p = 4, S = 2: the same twice, slice 0 through rank 0 and slice 1 through rank 1; the two
//   servers push their data for each other's slice too.
//
// Schedule: p-1 steps; at step k rank r pushes to (r + k) mod p if that rank is a server, and
// a server receives from (r - k) mod p (the pairwise all-to-all's shift, alltoall.h), so no two
// sends wait on each other; the pull runs the same steps the other way round.
//
// Cost (S_b = bytes of the buffer, S servers; a server's p-1 messages arrive one after another):
//   server:  receives (p-1) S_b/S and sends (p-1) S_b/S    -> 2 (p-1) alpha + 2 (p-1) S_b/S beta
//   worker:  sends S_b (minus its own slice if it is a server) and receives as much
// With S = 1 the server's link carries (p-1) S_b each way while a worker's carries S_b: the
// bottleneck grows with p, against the ring's 2 (p-1)/p S_b per rank. S = p is an all-to-all
// reduce-scatter then all-gather ("every rank a server"), as cheap in bytes as the ring.
// allreduce_parameter_server_volume (sent) and _received show the asymmetry per rank.
#pragma once

#include "agree.h"
#include "transport.h"

// push: every rank's slice s of buf goes to server s, which reduces them into its own slice
// (and finishes an average). Afterwards a server's slice holds the result; the other slices of
// buf are unchanged. Data parallelism pushes gradients this way (llmc/parallel/dp_ps.h).
static inline void ps_push(Comm* c, void* buf, size_t count, CommType t, CommOp op, int S) {
    int p = c->size, r = c->rank;
    size_t mine = r < S ? comm_block_count(count, S, r) : 0;
    char* slice = r < S ? comm_at(buf, comm_block_offset(count, S, r), t) : NULL;
    void* inc = comm_scratch(c, mine, t);
    for (int k = 1; k < p; k++) {
        int dst = (r + k) % p, src = (r - k + p) % p;
        bool out = dst < S, in = r < S;
        const char* o = out ? comm_at(buf, comm_block_offset(count, S, dst), t) : NULL;
        size_t no = out ? comm_block_count(count, S, dst) : 0;
        if (out && in) {
            comm_sendrecv(c, o, no, dst, inc, mine, src, t);
        } else if (out) {
            comm_send(c, o, no, t, dst);
        } else if (in) {
            comm_recv(c, inc, mine, t, src);
        }
        if (in) { comm_reduce_local(c, slice, inc, mine, t, op); }
    }
    if (r < S) { comm_avg_finish(c, slice, mine, t, op, p); }
    comm_scratch_free(c, inc);
}

// pull: server r sends its slice of buf to every other rank (data parallelism: the updated
// parameters)
static inline void ps_pull(Comm* c, void* buf, size_t count, CommType t, int S) {
    int p = c->size, r = c->rank;
    size_t mine = r < S ? comm_block_count(count, S, r) : 0;
    char* slice = r < S ? comm_at(buf, comm_block_offset(count, S, r), t) : NULL;
    for (int k = 1; k < p; k++) {
        int dst = (r + k) % p, src = (r - k + p) % p;
        bool out = r < S, in = src < S;
        char* i = in ? comm_at(buf, comm_block_offset(count, S, src), t) : NULL;
        size_t ni = in ? comm_block_count(count, S, src) : 0;
        if (out && in) {
            comm_sendrecv(c, slice, mine, dst, i, ni, src, t);
        } else if (out) {
            comm_send(c, slice, mine, t, dst);
        } else if (in) {
            comm_recv(c, i, ni, t, src);
        }
    }
}

static inline void allreduce_parameter_server(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op,
                                              int nservers) {
    comm_check_args(c, "allreduce_parameter_server", count, t, op, 0);
    comm_check_agree(c, "allreduce_parameter_server", "number of servers", nservers);
    int p = c->size, S = nservers;
    if (S < 1 || S > p) { comm_die(c, "allreduce_parameter_server", "%d servers, want 1 to %d (the number of ranks)", S, p); }
    if (count == 0) { return; }
    comm_copy(c, recv, send, count, t);
    ps_push(c, recv, count, t, op, S);
    ps_pull(c, recv, count, t, S);
}

// --- what rank r sends and receives (bytes, messages): the server/worker asymmetry

static inline CommVolume allreduce_parameter_server_volume(size_t count, CommType t, int p, int r, int nservers) {
    if (count == 0 || p == 1) { return {0, 0}; }
    uint64_t n = 0, msgs = 0;
    for (int s = 0; s < nservers; s++) {
        if (s != r) { n += comm_block_count(count, nservers, s); msgs++; }          // push
    }
    if (r < nservers) { n += (uint64_t)(p - 1) * comm_block_count(count, nservers, r); msgs += p - 1; }   // pull
    return {n * comm_type_size(t), msgs};
}
static inline CommVolume allreduce_parameter_server_received(size_t count, CommType t, int p, int r, int nservers) {
    if (count == 0 || p == 1) { return {0, 0}; }
    uint64_t n = 0, msgs = 0;
    if (r < nservers) { n += (uint64_t)(p - 1) * comm_block_count(count, nservers, r); msgs += p - 1; }   // push
    for (int s = 0; s < nservers; s++) {
        if (s != r) { n += comm_block_count(count, nservers, s); msgs++; }          // pull
    }
    return {n * comm_type_size(t), msgs};
}
