// Hierarchical all-reduce: nodes of n ranks (ranks [k n, (k+1) n) form node k, n dividing p),
// fast links inside a node, slow ones between nodes. Only 1/n of the buffer crosses nodes:
//
//   p = 4, n = 2: node 0 = {r0, r1}, node 1 = {r2, r3}; buffer halves X Y
//   1. reduce-scatter inside each node (ring):  r0 has X(r0+r1)  r1 has Y(r0+r1)
//                                               r2 has X(r2+r3)  r3 has Y(r2+r3)
//   2. all-reduce across nodes among the ranks with the same local index (ring or recursive
//      doubling): r0 <-> r2 on X, r1 <-> r3 on Y; now every X and Y is the sum of all 4
//   3. all-gather inside each node (ring): every rank has X Y
//
// Cost (S bytes, m = p/n nodes; alpha, beta inside a node; alpha', beta' between nodes):
//   2 (n-1) alpha + 2 (n-1)/n S beta                      (steps 1 and 3)
// + 2 (m-1) alpha' + 2 (m-1)/m (S/n) beta'                 (step 2 with the ring)
// Between nodes each rank sends 2 (m-1)/m S/n bytes instead of the flat ring's 2 (p-1)/p S
// with every other step crossing a node boundary.
//
// Sub-communicators: "node" (color r / n) and "cross" (color r mod n), made with comm_split.
// allreduce_hierarchical makes them on every call and frees them after: two MPI_Comm_split per
// call, each a collective over all p ranks (an all-gather of colors and keys, a context id
// agreement: several latencies, not counted in the traffic counters). For repeated calls (a
// training step's gradients) make a HierPlan once with hier_plan_make and call
// allreduce_hierarchical_plan. The sub-communicators count their own traffic; the plan call
// adds it to the parent's counters so that the parent shows all the algorithm sent.
#pragma once

#include "agree.h"
#include "ring.h"
#include "recursive.h"

typedef enum { HIER_INTER_RING = 0, HIER_INTER_RECURSIVE_DOUBLING = 1 } HierInter;

static inline const char* hier_inter_name(HierInter inter) {
    return inter == HIER_INTER_RING ? "ring" : "recursive_doubling";
}

typedef struct {
    Comm node;      // the n ranks of this rank's node, local index r mod n
    Comm cross;     // the p/n ranks with this rank's local index, one per node
    int node_size;
} HierPlan;

// collective over c; call names the algorithm in errors
static inline HierPlan hier_plan_make(Comm* c, const char* call, int node_size) {
    comm_check_agree(c, call, "node size", node_size);
    if (node_size < 1 || c->size % node_size != 0) {
        comm_die(c, call, "node size %d does not divide the %d ranks into whole nodes", node_size, c->size);
    }
    HierPlan h;
    h.node_size = node_size;
    h.node = comm_split(c, c->rank / node_size, c->rank, "node");
    h.cross = comm_split(c, c->rank % node_size, c->rank, "cross");
    h.node.check_args = 0;    // the parent's call checks the arguments once
    h.cross.check_args = 0;
    return h;
}

static inline void hier_plan_free(HierPlan* h) {
    comm_free(&h->node);
    comm_free(&h->cross);
}

static inline void allreduce_hierarchical_plan(Comm* c, HierPlan* h, const void* send, void* recv, size_t count,
                                               CommType t, CommOp op, HierInter inter) {
    comm_check_args(c, "allreduce_hierarchical", count, t, op, 0);
    if (count == 0) { return; }
    int n = h->node_size, l = h->node.rank;
    CommVolume before = {h->node.bytes_sent + h->cross.bytes_sent, h->node.messages_sent + h->cross.messages_sent};
    CommOp sub = op == COMM_AVG ? COMM_SUM : op;    // sum everywhere, divide by p once at the end
    comm_copy(c, recv, send, count, t);
    char* own = comm_at(recv, comm_block_offset(count, n, l), t);
    size_t mine = comm_block_count(count, n, l);
    reduce_scatter_ring(&h->node, recv, own, count, t, sub);
    if (inter == HIER_INTER_RING) {
        allreduce_ring(&h->cross, own, own, mine, t, sub);
    } else {
        allreduce_recursive_doubling(&h->cross, own, own, mine, t, sub);
    }
    comm_avg_finish(c, own, mine, t, op, c->size);
    allgather_ring(&h->node, own, recv, count, t);
    c->bytes_sent += h->node.bytes_sent + h->cross.bytes_sent - before.bytes;
    c->messages_sent += h->node.messages_sent + h->cross.messages_sent - before.messages;
}

static inline void allreduce_hierarchical(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op,
                                          int node_size, HierInter inter) {
    comm_check_args(c, "allreduce_hierarchical", count, t, op, 0);
    comm_check_agree(c, "allreduce_hierarchical", "inter-node algorithm", inter);
    HierPlan h = hier_plan_make(c, "allreduce_hierarchical", node_size);
    int saved = c->check_args;
    c->check_args = 0;   // checked above
    allreduce_hierarchical_plan(c, &h, send, recv, count, t, op, inter);
    c->check_args = saved;
    hier_plan_free(&h);
}

// --- what each rank sends (bytes, messages): the three phases' formulas

static inline CommVolume allreduce_hierarchical_volume(size_t count, CommType t, int p, int r, int node_size, HierInter inter) {
    int n = node_size, l = r % n, m = p / n, k = r / n;
    size_t mine = comm_block_count(count, n, l);
    CommVolume a = reduce_scatter_ring_volume(count, t, n, l);
    CommVolume b = inter == HIER_INTER_RING ? allreduce_ring_volume(mine, t, m, k)
                                            : allreduce_recursive_doubling_volume(mine, t, m, k);
    CommVolume g = allgather_ring_volume(count, t, n, l);
    if (count == 0) { return {0, 0}; }
    return {a.bytes + b.bytes + g.bytes, a.messages + b.messages + g.messages};
}
