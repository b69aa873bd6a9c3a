// Binomial-tree broadcast and reduce, any root. Ranks are renumbered relative to the root,
// v = (rank - root) mod p, so the root is v = 0. With K = ceil(log2 p) rounds, in broadcast
// round k every rank that already has the data sends it to v + 2^(K-1-k): the number of ranks
// holding the data doubles each round. Reduce is the same tree run backwards, adding on the
// way up.
//
//   broadcast, p = 8 (v numbers):                reduce, the mirror image:
//   round 0:  0 -> 4                             round 0:  1 -> 0  3 -> 2  5 -> 4  7 -> 6
//   round 1:  0 -> 2  4 -> 6                     round 1:  2 -> 0  6 -> 4
//   round 2:  0 -> 1  2 -> 3  4 -> 5  6 -> 7     round 2:  4 -> 0
//
// A rank v receives from v - lowbit(v) and sends to v + 2^j for each 2^j < lowbit(v) (the root:
// each 2^j < p) with v + 2^j < p; farthest child first in broadcast, nearest first in reduce.
//
// Cost: ceil(log2 p) (alpha + S beta). Few messages, so it wins for small S; every round moves
// the whole buffer, so the ring's pipelined broadcast wins for large S.
// Bytes a rank sends: broadcast, S per child; reduce, S once (the root sends nothing).
#pragma once

#include "transport.h"

// lowbit(v) for v > 0; for the root (v = 0) the first power of two >= p
static inline int tree_parent_mask(int v, int p) {
    int mask = 1;
    while (mask < p && (v & mask) == 0) { mask <<= 1; }
    return mask;
}

static inline int tree_children(int v, int p) {
    int n = 0;
    for (int m = 1; m < tree_parent_mask(v, p); m <<= 1) { n += v + m < p; }
    return n;
}

static inline void broadcast_tree(Comm* c, void* buf, size_t count, CommType t, int root) {
    comm_check_root(c, "broadcast_tree", root);
    comm_check_args(c, "broadcast_tree", count, t, COMM_SUM, root);
    int p = c->size;
    if (count == 0 || p == 1) { return; }
    int v = (c->rank - root + p) % p;
    int mask = tree_parent_mask(v, p);
    if (v > 0) { comm_recv(c, buf, count, t, (v - mask + root) % p); }
    for (mask >>= 1; mask > 0; mask >>= 1) {            // farthest child first
        if (v + mask < p) { comm_send(c, buf, count, t, (v + mask + root) % p); }
    }
}

// recv is written at the root only; in place at the root: send == recv
static inline void reduce_tree(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op, int root) {
    comm_check_root(c, "reduce_tree", root);
    comm_check_args(c, "reduce_tree", count, t, op, root);
    int p = c->size;
    if (count == 0) { return; }
    int v = (c->rank - root + p) % p;
    void* acc = comm_scratch(c, count, t);
    void* inc = comm_scratch(c, count, t);
    comm_copy(c, acc, send, count, t);
    for (int mask = 1; mask < p; mask <<= 1) {
        if (v & mask) {                                  // hand the partial sum to the parent
            comm_send(c, acc, count, t, (v - mask + root) % p);
            break;
        }
        if (v + mask < p) {                              // nearest child first
            comm_recv(c, inc, count, t, (v + mask + root) % p);
            comm_reduce_local(c, acc, inc, count, t, op);
        }
    }
    if (v == 0) {
        comm_copy(c, recv, acc, count, t);
        comm_avg_finish(c, recv, count, t, op, p);
    }
    comm_scratch_free(c, acc);
    comm_scratch_free(c, inc);
}

static inline CommVolume broadcast_tree_volume(size_t count, CommType t, int p, int r, int root) {
    if (count == 0) { return {0, 0}; }
    uint64_t children = (uint64_t)tree_children((r - root + p) % p, p);
    return {children * count * comm_type_size(t), children};
}
static inline CommVolume reduce_tree_volume(size_t count, CommType t, int p, int r, int root) {
    if (count == 0 || r == root) { return {0, 0}; }
    (void)p;
    return {count * comm_type_size(t), 1};
}
