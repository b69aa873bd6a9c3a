// Ring algorithms: every rank talks only to its two neighbours, right = r+1 and left = r-1
// (mod p), and every step moves one block of the balanced split (comm.h) per rank.
//
// Reduce-scatter, p = 4, blocks A B C D (rank r ends owning block r, fully reduced). At step
// s rank r sends block r-s-1 to the right, receives block r-s-2 from the left and adds its own
// copy of that block into it:
//
//   step 0:  r0 sends D  r1 sends A  r2 sends B  r3 sends C       (own data)
//   step 1:  r0 sends C  r1 sends D  r2 sends A  r3 sends B       (partial sums of 2 ranks)
//   step 2:  r0 sends B  r1 sends C  r2 sends D  r3 sends A       (partial sums of 3 ranks)
//   now r0 owns A (4 ranks' sum), r1 owns B, r2 owns C, r3 owns D
//
// All-gather runs the same ring without the addition: at step s rank r forwards block r-s.
// All-reduce = reduce-scatter then all-gather: 2(p-1) steps.
//
// Cost (alpha = latency per message, beta = seconds per byte, S = bytes of the full buffer):
//   reduce-scatter, all-gather:  (p-1) alpha + (p-1)/p S beta
//   all-reduce:                 2(p-1) alpha + 2(p-1)/p S beta    (bandwidth-optimal)
// Bytes a rank sends: S minus its own block (reduce-scatter) or its right neighbour's block
// (all-gather); with uneven blocks the *_volume functions give the exact figure.
//
// Pipelined broadcast: the ranks form a chain from the root; the buffer is cut into chunks, and
// while rank v forwards chunk k to v+1 it already receives chunk k+1 from v-1:
//   (p-1 + S/C - 1) (alpha + C beta)  for chunk size C: close to S beta for large S.
#pragma once

#include <algorithm>
#include <utility>
#include "transport.h"

static inline int ring_mod(int a, int p) { return ((a % p) + p) % p; }

static inline void reduce_scatter_ring(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "reduce_scatter_ring", count, t, op, 0);
    int p = c->size, r = c->rank;
    if (count == 0) { return; }
    size_t mine = comm_block_count(count, p, r);
    if (p == 1) {
        comm_copy(c, recv, send, count, t);
        comm_avg_finish(c, recv, count, t, op, p);
        return;
    }
    int right = ring_mod(r + 1, p), left = ring_mod(r - 1, p);
    size_t max_block = comm_block_count(count, p, 0);
    void* acc = comm_scratch(c, max_block, t);   // the partial sum we send next
    void* inc = comm_scratch(c, max_block, t);   // the partial sum arriving from the left
    for (int s = 0; s < p - 1; s++) {
        int bs = ring_mod(r - s - 1, p), br = ring_mod(r - s - 2, p);
        const void* out = s == 0 ? comm_at(send, comm_block_offset(count, p, bs), t) : acc;
        comm_sendrecv(c, out, comm_block_count(count, p, bs), right,
                      inc, comm_block_count(count, p, br), left, t);
        comm_reduce_local(c, inc, comm_at(send, comm_block_offset(count, p, br), t), comm_block_count(count, p, br), t, op);
        std::swap(acc, inc);
    }
    // the last block received and reduced is block r; in place, recv is send's block r, read above
    comm_copy(c, recv, acc, mine, t);
    comm_avg_finish(c, recv, mine, t, op, p);
    comm_scratch_free(c, acc);
    comm_scratch_free(c, inc);
}

static inline void allgather_ring(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "allgather_ring", count, t, COMM_SUM, 0);
    int p = c->size, r = c->rank;
    if (count == 0) { return; }
    comm_copy(c, comm_at(recv, comm_block_offset(count, p, r), t), send, comm_block_count(count, p, r), t);
    int right = ring_mod(r + 1, p), left = ring_mod(r - 1, p);
    for (int s = 0; s < p - 1; s++) {
        int bs = ring_mod(r - s, p), br = ring_mod(r - s - 1, p);
        comm_sendrecv(c, comm_at(recv, comm_block_offset(count, p, bs), t), comm_block_count(count, p, bs), right,
                      comm_at(recv, comm_block_offset(count, p, br), t), comm_block_count(count, p, br), left, t);
    }
}

// All-reduce runs the reduce-scatter directly in recv, so no extra copy of the buffer is
// made: at step s the block arriving from the left lands in its own place in recv and the
// local contribution (send's copy of that block) is added to it there; the next step sends
// that block on from recv. Out of place that needs no scratch at all; in place (send == recv)
// the arriving block needs a scratch block, since recv still holds this rank's own data.
// After p-1 steps recv's block r is complete; the all-gather then fills the other blocks.
static inline void allreduce_ring(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "allreduce_ring", count, t, op, 0);
    if (count == 0) { return; }
    int p = c->size, r = c->rank;
    if (p == 1) {
        comm_copy(c, recv, send, count, t);
        comm_avg_finish(c, recv, count, t, op, p);
        return;
    }
    int right = ring_mod(r + 1, p), left = ring_mod(r - 1, p);
    bool in_place = send == recv;
    void* inc = in_place ? comm_scratch(c, comm_block_count(count, p, 0), t) : NULL;
    for (int s = 0; s < p - 1; s++) {                       // reduce-scatter, in recv
        int bs = ring_mod(r - s - 1, p), br = ring_mod(r - s - 2, p);
        size_t ns = comm_block_count(count, p, bs), nr = comm_block_count(count, p, br);
        const void* out = comm_at(s == 0 ? send : recv, comm_block_offset(count, p, bs), t);
        char* dst = comm_at(recv, comm_block_offset(count, p, br), t);
        if (in_place) {
            comm_sendrecv(c, out, ns, right, inc, nr, left, t);
            comm_reduce_local(c, dst, inc, nr, t, op);
        } else {
            comm_sendrecv(c, out, ns, right, dst, nr, left, t);
            comm_reduce_local(c, dst, comm_at(send, comm_block_offset(count, p, br), t), nr, t, op);
        }
    }
    comm_scratch_free(c, inc);
    char* own = comm_at(recv, comm_block_offset(count, p, r), t);
    comm_avg_finish(c, own, comm_block_count(count, p, r), t, op, p);
    int saved = c->check_args;
    c->check_args = 0;   // checked once above
    allgather_ring(c, own, recv, count, t);
    c->check_args = saved;
}

static const size_t RING_BROADCAST_CHUNK_BYTES = 256 * 1024;

static inline size_t ring_broadcast_chunk(size_t chunk_elems, CommType t) {
    return chunk_elems > 0 ? chunk_elems : RING_BROADCAST_CHUNK_BYTES / comm_type_size(t);
}

// chunk_elems = 0 picks RING_BROADCAST_CHUNK_BYTES
static inline void broadcast_ring_chunked(Comm* c, void* buf, size_t count, CommType t, int root, size_t chunk_elems) {
    comm_check_root(c, "broadcast_ring", root);
    comm_check_args(c, "broadcast_ring", count, t, COMM_SUM, root);
    int p = c->size;
    if (count == 0 || p == 1) { return; }
    size_t chunk = ring_broadcast_chunk(chunk_elems, t);
    size_t nchunks = ceil_div(count, chunk);
    int v = ring_mod(c->rank - root, p);              // position in the chain, the root is 0
    int prev = ring_mod(c->rank - 1, p), next = ring_mod(c->rank + 1, p);
    bool receives = v > 0, sends = v < p - 1;
    // step k: forward chunk k-1 to the next rank while chunk k arrives from the previous one
    for (size_t k = 0; k <= nchunks; k++) {
        bool out = sends && k >= 1, in = receives && k < nchunks;
        size_t ko = k - 1, ki = k;
        char* po = out ? comm_at(buf, ko * chunk, t) : NULL;
        char* pi = in ? comm_at(buf, ki * chunk, t) : NULL;
        size_t no = out ? std::min(chunk, count - ko * chunk) : 0;
        size_t ni = in ? std::min(chunk, count - ki * chunk) : 0;
        if (out && in) {
            comm_sendrecv(c, po, no, next, pi, ni, prev, t);
        } else if (out) {
            comm_send(c, po, no, t, next);
        } else if (in) {
            comm_recv(c, pi, ni, t, prev);
        }
        // the root has nothing to receive: it sends chunk k at step k+1, i.e. one step later than
        // it could, which costs one alpha and keeps the loop uniform
    }
}

static inline void broadcast_ring(Comm* c, void* buf, size_t count, CommType t, int root) {
    broadcast_ring_chunked(c, buf, count, t, root, 0);
}

// --- what each rank sends (bytes, messages), for the tests and the benchmark

static inline CommVolume reduce_scatter_ring_volume(size_t count, CommType t, int p, int r) {
    if (count == 0 || p == 1) { return {0, 0}; }
    return {(count - comm_block_count(count, p, r)) * comm_type_size(t), (uint64_t)(p - 1)};
}
static inline CommVolume allgather_ring_volume(size_t count, CommType t, int p, int r) {
    if (count == 0 || p == 1) { return {0, 0}; }
    return {(count - comm_block_count(count, p, ring_mod(r + 1, p))) * comm_type_size(t), (uint64_t)(p - 1)};
}
static inline CommVolume allreduce_ring_volume(size_t count, CommType t, int p, int r) {
    CommVolume a = reduce_scatter_ring_volume(count, t, p, r), b = allgather_ring_volume(count, t, p, r);
    return {a.bytes + b.bytes, a.messages + b.messages};
}
static inline CommVolume broadcast_ring_volume(size_t count, CommType t, int p, int r, int root, size_t chunk_elems) {
    if (count == 0 || p == 1 || ring_mod(r - root, p) == p - 1) { return {0, 0}; }   // the chain's end
    return {count * comm_type_size(t), ceil_div(count, ring_broadcast_chunk(chunk_elems, t))};
}
