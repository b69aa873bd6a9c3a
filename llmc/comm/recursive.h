// Recursive doubling and halving: log2(p) steps, in each of which rank r exchanges with the
// partner r XOR 2^k (a butterfly), so the number of ranks whose data a rank holds doubles.
//
//   recursive doubling all-reduce, p = 4 (each step: exchange whole buffers and add):
//   step 0:  0 <-> 1   2 <-> 3        now 0,1 hold a+b and 2,3 hold c+d
//   step 1:  0 <-> 2   1 <-> 3        now all hold a+b+c+d
//
//   recursive halving reduce-scatter, p = 4, blocks A B C D: each step a rank keeps half of
//   what it is responsible for, sends the other half to its partner, and adds what it receives:
//   step 0:  0 <-> 2: 0 keeps AB, 2 keeps CD (1 <-> 3 likewise)   distance p/2, S/2 bytes
//   step 1:  0 <-> 1: 0 keeps A,  1 keeps B  (2 <-> 3 likewise)   distance p/4, S/4 bytes
//   recursive doubling all-gather is the reverse: distance 1, 2, ...; S/p, 2S/p, ... bytes.
//   Rabenseifner all-reduce = halving reduce-scatter, then doubling all-gather.
//
// Not a power of two: p = p2 + rem with p2 the largest power of two <= p. First the fold-in:
// each even rank r < 2 rem hands its data to r+1 and sits out; the remaining p2 ranks get
// virtual ranks 0..p2-1 (r < 2 rem: r/2; else r - rem) and run the power-of-two algorithm;
// finally each odd r < 2 rem hands the result back to r-1. Virtual rank k stands for the real
// ranks {2k, 2k+1} (k < rem) or {k + rem}, so it is responsible for those ranks' blocks, a
// contiguous range: halving and doubling work on ranges of blocks [bound(k), bound(k+1)).
//
// Cost (power-of-two p, S bytes, L = log2 p):
//   all-reduce, recursive doubling:  L alpha + L S beta           (latency-optimal, small S)
//   reduce-scatter (halving), all-gather (doubling):  L alpha + (p-1)/p S beta
//   Rabenseifner all-reduce:  2 L alpha + 2 (p-1)/p S beta        (bandwidth-optimal, large S)
// The fold-in adds one S-sized message before and after (two steps) for the ranks r < 2 rem.
// The *_volume functions give each rank's exact bytes and messages.
//
// No copy of the input: the first step that reduces (the fold-in's, or the first exchange's)
// reads this rank's data from `send` and lets the partner's data land in place in the output,
// then adds send's copy to it there (out = received op send). Later steps have their data in the
// output already; they receive into a scratch buffer and add it in. So an all-reduce touches S
// bytes less memory than "copy send to recv, then reduce in recv". In place (send == recv) every
// step receives into the scratch buffer.
#pragma once

#include <vector>
#include "transport.h"

// --- the fold-in of the ranks beyond the largest power of two

typedef struct {
    int p2, rem;       // p = p2 + rem
    int vrank;         // this rank's virtual rank, -1 if it sits out (even r < 2 rem)
} Fold;

static inline Fold fold_make(int p, int r) {
    Fold f;
    f.p2 = 1;
    while (f.p2 * 2 <= p) { f.p2 *= 2; }
    f.rem = p - f.p2;
    f.vrank = r < 2 * f.rem ? (r % 2 == 1 ? r / 2 : -1) : r - f.rem;
    return f;
}
static inline int fold_real(const Fold& f, int k) { return k < f.rem ? 2 * k + 1 : k + f.rem; }
// first real rank (= block) virtual rank k is responsible for; fold_first_block(f, p2) = p
static inline int fold_first_block(const Fold& f, int k) { return k < f.rem ? 2 * k : k + f.rem; }
static inline int fold_log2(int p2) { int l = 0; while ((1 << l) < p2) { l++; } return l; }

// element bounds of the virtual ranks' ranges: the real blocks they stand for
static inline std::vector<size_t> fold_block_bounds(const Fold& f, size_t count, int p) {
    std::vector<size_t> b(f.p2 + 1);
    for (int k = 0; k <= f.p2; k++) { b[k] = comm_block_offset(count, p, fold_first_block(f, k)); }
    return b;
}

// One reducing exchange with `peer`: send n_out elements from `out`, and leave
// work[keep .. keep + n) = (the peer's n elements) op in[keep .. keep + n). `in` is this rank's
// data: a buffer apart from work (send, first step: the peer's data lands in work and in is added
// to it, no copy) or work itself (the peer's data lands in tmp, which is then added into work).
static inline void reduce_exchange(Comm* c, const void* out, size_t n_out, int peer, const void* in, void* work,
                                   size_t keep, size_t n, void* tmp, CommType t, CommOp op) {
    char* dst = comm_at(work, keep, t);
    if (in != work) {
        comm_sendrecv(c, out, n_out, peer, dst, n, peer, t);
        comm_reduce_local(c, dst, comm_at(in, keep, t), n, t, op);
    } else {
        comm_sendrecv(c, out, n_out, peer, tmp, n, peer, t);
        comm_reduce_local(c, dst, tmp, n, t, op);
    }
}

// --- the power-of-two cores, on virtual ranks, over a full-size buffer `work`

// Recursive halving: on return, work[b[v] .. b[v+1]) holds the reduction over all virtual
// ranks. `in` holds this rank's data on entry: send (read by the first step only) or work
// itself. tmp holds at least b[p2] / 2 rounded up to whole ranges (count elements is enough).
static inline void halving_core(Comm* c, const Fold& f, const std::vector<size_t>& b, const void* in, void* work,
                                void* tmp, CommType t, CommOp op) {
    int v = f.vrank, lo = 0, hi = f.p2;
    for (int mask = f.p2 / 2; mask >= 1; mask /= 2) {
        int mid = lo + mask;
        bool upper = (v & mask) != 0;
        int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
        int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
        int peer = fold_real(f, v ^ mask);
        reduce_exchange(c, comm_at(in, b[give_lo], t), b[give_hi] - b[give_lo], peer,
                        in, work, b[keep_lo], b[keep_hi] - b[keep_lo], tmp, t, op);
        in = work;   // from the second step on, this rank's partial sums are in work
        lo = keep_lo;
        hi = keep_hi;
    }
}

// Recursive doubling all-gather: work[b[v] .. b[v+1]) is filled on entry; all of it on return.
static inline void doubling_gather_core(Comm* c, const Fold& f, const std::vector<size_t>& b, void* work, CommType t) {
    int v = f.vrank;
    for (int mask = 1; mask < f.p2; mask *= 2) {
        int u = v ^ mask;
        int lo = v / mask * mask, plo = u / mask * mask;   // the ranges each side holds so far
        comm_sendrecv(c, comm_at(work, b[lo], t), b[lo + mask] - b[lo], fold_real(f, u),
                      comm_at(work, b[plo], t), b[plo + mask] - b[plo], fold_real(f, u), t);
    }
}

// fold-in of whole buffers: even r < 2 rem sends its data `in`, r + 1 reduces it with its own
// into work. Returns where this rank's data lies now: work for r + 1, else still `in`.
static inline const void* fold_in_reduce(Comm* c, const Fold& f, const void* in, void* work, void* tmp, size_t count,
                                         CommType t, CommOp op) {
    int r = c->rank;
    if (r >= 2 * f.rem) { return in; }
    if (f.vrank < 0) {
        comm_send(c, in, count, t, r + 1);
        return in;
    }
    if (in != work) {   // out of place: the message lands in work, and in is added to it there
        comm_recv(c, work, count, t, r - 1);
        comm_reduce_local(c, work, in, count, t, op);
    } else {
        comm_recv(c, tmp, count, t, r - 1);
        comm_reduce_local(c, work, tmp, count, t, op);
    }
    return work;
}
// fold-out of whole buffers: odd r < 2 rem returns the result to r - 1
static inline void fold_out(Comm* c, const Fold& f, void* work, size_t count, CommType t) {
    int r = c->rank;
    if (r >= 2 * f.rem) { return; }
    if (f.vrank < 0) {
        comm_recv(c, work, count, t, r + 1);
    } else {
        comm_send(c, work, count, t, r - 1);
    }
}

// --- the algorithms

static inline void allreduce_recursive_doubling(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "allreduce_recursive_doubling", count, t, op, 0);
    if (count == 0) { return; }
    if (c->size == 1) {
        comm_copy(c, recv, send, count, t);
        comm_avg_finish(c, recv, count, t, op, 1);
        return;
    }
    Fold f = fold_make(c->size, c->rank);
    void* tmp = comm_scratch(c, count, t);
    const void* in = fold_in_reduce(c, f, send, recv, tmp, count, t, op);   // this rank's data: send or recv
    if (f.vrank >= 0) {
        for (int mask = 1; mask < f.p2; mask *= 2) {
            int peer = fold_real(f, f.vrank ^ mask);
            reduce_exchange(c, in, count, peer, in, recv, 0, count, tmp, t, op);
            in = recv;
        }
        comm_avg_finish(c, recv, count, t, op, c->size);
    }
    fold_out(c, f, recv, count, t);
    comm_scratch_free(c, tmp);
}

static inline void reduce_scatter_recursive_halving(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "reduce_scatter_recursive_halving", count, t, op, 0);
    if (count == 0) { return; }
    int p = c->size, r = c->rank;
    if (p == 1) {
        comm_copy(c, recv, send, count, t);
        comm_avg_finish(c, recv, count, t, op, 1);
        return;
    }
    Fold f = fold_make(p, r);
    void* work = comm_scratch(c, count, t);      // send stays untouched: in place, recv lies inside it
    void* tmp = comm_scratch(c, count, t);
    const void* in = fold_in_reduce(c, f, send, work, tmp, count, t, op);
    std::vector<size_t> b = fold_block_bounds(f, count, p);
    if (f.vrank >= 0) {
        halving_core(c, f, b, in, work, tmp, t, op);
        comm_avg_finish(c, comm_at(work, b[f.vrank], t), b[f.vrank + 1] - b[f.vrank], t, op, p);
    }
    // fold-out: odd r < 2 rem holds blocks r-1 and r, and hands block r-1 back
    size_t off = comm_block_offset(count, p, r), n = comm_block_count(count, p, r);
    if (f.vrank < 0) {
        comm_recv(c, recv, n, t, r + 1);
    } else {
        if (r < 2 * f.rem) {
            comm_send(c, comm_at(work, comm_block_offset(count, p, r - 1), t), comm_block_count(count, p, r - 1), t, r - 1);
        }
        comm_copy(c, recv, comm_at(work, off, t), n, t);
    }
    comm_scratch_free(c, work);
    comm_scratch_free(c, tmp);
}

static inline void allgather_recursive_doubling(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "allgather_recursive_doubling", count, t, COMM_SUM, 0);
    if (count == 0) { return; }
    int p = c->size, r = c->rank;
    Fold f = fold_make(p, r);
    comm_copy(c, comm_at(recv, comm_block_offset(count, p, r), t), send, comm_block_count(count, p, r), t);
    // fold-in: even r < 2 rem hands its block to r + 1, which then holds blocks r-1 and r
    if (r < 2 * f.rem) {
        if (f.vrank < 0) {
            comm_send(c, comm_at(recv, comm_block_offset(count, p, r), t), comm_block_count(count, p, r), t, r + 1);
        } else {
            comm_recv(c, comm_at(recv, comm_block_offset(count, p, r - 1), t), comm_block_count(count, p, r - 1), t, r - 1);
        }
    }
    if (f.vrank >= 0) { doubling_gather_core(c, f, fold_block_bounds(f, count, p), recv, t); }
    fold_out(c, f, recv, count, t);
}

static inline void allreduce_rabenseifner(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "allreduce_rabenseifner", count, t, op, 0);
    if (count == 0) { return; }
    int p = c->size;
    if (p == 1) {
        comm_copy(c, recv, send, count, t);
        comm_avg_finish(c, recv, count, t, op, 1);
        return;
    }
    Fold f = fold_make(p, c->rank);
    void* tmp = comm_scratch(c, count, t);
    const void* in = fold_in_reduce(c, f, send, recv, tmp, count, t, op);   // this rank's data: send or recv
    if (f.vrank >= 0) {
        // after the fold-in only p2 ranks remain: split the buffer evenly among them
        std::vector<size_t> b(f.p2 + 1);
        for (int k = 0; k <= f.p2; k++) { b[k] = comm_block_offset(count, f.p2, k); }
        halving_core(c, f, b, in, recv, tmp, t, op);
        comm_avg_finish(c, comm_at(recv, b[f.vrank], t), b[f.vrank + 1] - b[f.vrank], t, op, p);
        doubling_gather_core(c, f, b, recv, t);
    }
    fold_out(c, f, recv, count, t);
    comm_scratch_free(c, tmp);
}

// --- what each rank sends (bytes, messages), walking the same schedule

// elements sent by virtual rank v in halving_core and in doubling_gather_core
static inline size_t halving_sent(const Fold& f, const std::vector<size_t>& b, int v) {
    size_t n = 0;
    int lo = 0, hi = f.p2;
    for (int mask = f.p2 / 2; mask >= 1; mask /= 2) {
        int mid = lo + mask;
        if (v & mask) { n += b[mid] - b[lo]; lo = mid; } else { n += b[hi] - b[mid]; hi = mid; }
    }
    return n;
}
static inline size_t doubling_sent(const Fold& f, const std::vector<size_t>& b, int v) {
    size_t n = 0;
    for (int mask = 1; mask < f.p2; mask *= 2) {
        int lo = v / mask * mask;
        n += b[lo + mask] - b[lo];
    }
    return n;
}

static inline CommVolume allreduce_recursive_doubling_volume(size_t count, CommType t, int p, int r) {
    Fold f = fold_make(p, r);
    if (count == 0) { return {0, 0}; }
    if (f.vrank < 0) { return {count * comm_type_size(t), 1}; }
    uint64_t msgs = fold_log2(f.p2) + (r < 2 * f.rem ? 1 : 0);
    return {msgs * count * comm_type_size(t), msgs};
}

static inline CommVolume reduce_scatter_recursive_halving_volume(size_t count, CommType t, int p, int r) {
    Fold f = fold_make(p, r);
    if (count == 0) { return {0, 0}; }
    if (f.vrank < 0) { return {count * comm_type_size(t), 1}; }
    size_t n = halving_sent(f, fold_block_bounds(f, count, p), f.vrank);
    uint64_t msgs = fold_log2(f.p2);
    if (r < 2 * f.rem) { n += comm_block_count(count, p, r - 1); msgs += 1; }
    return {n * comm_type_size(t), msgs};
}

static inline CommVolume allgather_recursive_doubling_volume(size_t count, CommType t, int p, int r) {
    Fold f = fold_make(p, r);
    if (count == 0) { return {0, 0}; }
    if (f.vrank < 0) { return {comm_block_count(count, p, r) * comm_type_size(t), 1}; }
    size_t n = doubling_sent(f, fold_block_bounds(f, count, p), f.vrank);
    uint64_t msgs = fold_log2(f.p2);
    if (r < 2 * f.rem) { n += count; msgs += 1; }
    return {n * comm_type_size(t), msgs};
}

static inline CommVolume allreduce_rabenseifner_volume(size_t count, CommType t, int p, int r) {
    Fold f = fold_make(p, r);
    if (count == 0) { return {0, 0}; }
    if (f.vrank < 0) { return {count * comm_type_size(t), 1}; }
    std::vector<size_t> b(f.p2 + 1);
    for (int k = 0; k <= f.p2; k++) { b[k] = comm_block_offset(count, f.p2, k); }
    size_t n = halving_sent(f, b, f.vrank) + doubling_sent(f, b, f.vrank);
    uint64_t msgs = 2 * fold_log2(f.p2);
    if (r < 2 * f.rem) { n += count; msgs += 1; }
    return {n * comm_type_size(t), msgs};
}
