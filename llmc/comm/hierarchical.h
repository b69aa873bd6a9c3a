// Hierarchical all-reduce: nodes of n ranks (ranks [k n, (k+1) n) form node k, n dividing p),
// fast links inside a node, slow ones between nodes. Two schedules, both sending less over the
// slow links than a flat ring, which has a pair crossing a node boundary in every one of its
// 2 (p-1) steps.
//
// 1. allreduce_hierarchical: reduce-scatter -> all-reduce -> all-gather. Every rank of a node
//    works on its own 1/n of the buffer, so only S/n per rank crosses nodes:
//
//   p = 4, n = 2: node 0 = {r0, r1}, node 1 = {r2, r3}; buffer halves X Y
//   1. reduce-scatter inside each node (ring):  r0 has X(r0+r1)  r1 has Y(r0+r1)
//                                               r2 has X(r2+r3)  r3 has Y(r2+r3)
//   2. all-reduce across nodes among the ranks with the same local index (ring or recursive
//      doubling): r0 <-> r2 on X, r1 <-> r3 on Y; now every X and Y is the sum of all 4
//   3. all-gather inside each node (ring): every rank has X Y
//
// 2. allreduce_hierarchical_leader: reduce -> all-reduce -> broadcast, the lecture's picture
//    ("Data Parallelism in LLM Training"): one leader per node (local index 0) does all the
//    talking between nodes, on the whole buffer:
//
//   p = 4, n = 2: leaders r0 and r2; whole buffers a b c d
//   1. reduce inside each node to its leader (binomial tree):  r0 has a+b       r2 has c+d
//   2. all-reduce among the leaders (ring or recursive doubling): r0, r2 have a+b+c+d
//   3. broadcast inside each node from its leader (binomial tree): every rank has a+b+c+d
//
//   Steps 1 and 3 use tree.h's reduce_tree and broadcast_tree: the only rooted reduce in
//   llmc/comm/ is the tree, and n (the GPUs of a node, 2 to 8) is small, so its ceil(log2 n)
//   whole-buffer steps are few; broadcast_ring's pipelined chain would move fewer bytes per
//   rank for large S, but the tree keeps the two halves mirror images of each other.
//
// Cost (S bytes, m = p/n nodes; alpha, beta inside a node; alpha', beta' between nodes; ring
// between nodes):
//   reduce-scatter variant:  2 (n-1) alpha + 2 (n-1)/n S beta                  (steps 1, 3)
//                          + 2 (m-1) alpha' + 2 (m-1)/m (S/n) (k beta')         (step 2)
//   leader variant:          2 ceil(log2 n) (alpha + S beta)                    (steps 1, 3)
//                          + 2 (m-1) alpha' + 2 (m-1)/m S (k beta')             (step 2)
// k counts the flows that leave a node at once and share its network link. With one network
// link per node (one NIC, or our namespaces' one veth) all n ranks of the reduce-scatter
// variant cross at the same time, k = n, and the same bytes leave a node in both variants:
// n x 2 (m-1)/m S/n = 2 (m-1)/m S. The leader variant drives that link from one rank (k = 1)
// and pays for it inside the node: log2 n whole buffers each way instead of (n-1)/n of one.
// With one NIC per GPU (a DGX node: 8 GPUs, 8 NICs) each flow has its own link, k = 1 for
// both, and the reduce-scatter variant moves n times fewer bytes through each NIC: that is why
// NCCL's schedule is the first one. With recursive doubling between nodes, step 2 costs
// log2 m (alpha' + S/n (k beta')) and log2 m (alpha' + S k beta') respectively.
//
// Sub-communicators: "node" (color r / n) and "cross" (color r mod n), made with comm_split;
// the leaders are the "cross" communicator of local index 0 (the others sit step 2 out in the
// leader variant). allreduce_hierarchical(_leader) makes them on every call and frees them
// after: two MPI_Comm_split per call, each a collective over all p ranks (an all-gather of
// colors and keys, a context id agreement: several latencies, not counted in the traffic
// counters). For repeated calls (a training step's gradients) make a HierPlan once with
// hier_plan_make and call the *_plan functions. The sub-communicators count their own traffic;
// the plan calls add it to the parent's counters so that the parent shows all the algorithm sent.
#pragma once

#include "agree.h"
#include "ring.h"
#include "recursive.h"
#include "tree.h"

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

// the plan's traffic so far (its sub-communicators count their own)
static inline CommVolume hier_sent(const HierPlan* h) {
    return {h->node.bytes_sent + h->cross.bytes_sent, h->node.messages_sent + h->cross.messages_sent};
}
// adds what the sub-communicators sent since `before` to the parent's counters
static inline void hier_count(Comm* c, const HierPlan* h, CommVolume before) {
    CommVolume now = hier_sent(h);
    c->bytes_sent += now.bytes - before.bytes;
    c->messages_sent += now.messages - before.messages;
}
// the all-reduce across nodes, on the cross communicator
static inline void hier_cross_allreduce(HierPlan* h, void* buf, size_t count, CommType t, CommOp op, HierInter inter) {
    if (inter == HIER_INTER_RING) {
        allreduce_ring(&h->cross, buf, buf, count, t, op);
    } else {
        allreduce_recursive_doubling(&h->cross, buf, buf, count, t, op);
    }
}

static inline void allreduce_hierarchical_plan(Comm* c, HierPlan* h, const void* send, void* recv, size_t count,
                                               CommType t, CommOp op, HierInter inter) {
    comm_check_args(c, "allreduce_hierarchical", count, t, op, 0);
    if (count == 0) { return; }
    int n = h->node_size, l = h->node.rank;
    CommVolume before = hier_sent(h);
    CommOp sub = op == COMM_AVG ? COMM_SUM : op;    // sum everywhere, divide by p once at the end
    comm_copy(c, recv, send, count, t);
    char* own = comm_at(recv, comm_block_offset(count, n, l), t);
    size_t mine = comm_block_count(count, n, l);
    reduce_scatter_ring(&h->node, recv, own, count, t, sub);
    hier_cross_allreduce(h, own, mine, t, sub, inter);
    comm_avg_finish(c, own, mine, t, op, c->size);
    allgather_ring(&h->node, own, recv, count, t);
    hier_count(c, h, before);
}

// One call without a plan of its own: the plan made, used once (by `plan`) and freed.
typedef void (*HierPlanFn)(Comm*, HierPlan*, const void*, void*, size_t, CommType, CommOp, HierInter);
static inline void hier_call_once(Comm* c, const char* call, HierPlanFn plan, const void* send, void* recv,
                                  size_t count, CommType t, CommOp op, int node_size, HierInter inter) {
    comm_check_args(c, call, count, t, op, 0);
    comm_check_agree(c, call, "inter-node algorithm", inter);
    HierPlan h = hier_plan_make(c, call, node_size);
    int saved = c->check_args;
    c->check_args = 0;   // checked above
    plan(c, &h, send, recv, count, t, op, inter);
    c->check_args = saved;
    hier_plan_free(&h);
}

static inline void allreduce_hierarchical(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op,
                                          int node_size, HierInter inter) {
    hier_call_once(c, "allreduce_hierarchical", allreduce_hierarchical_plan, send, recv, count, t, op, node_size, inter);
}

// The lecture's schedule (picture 2 above): sum onto the leader, all-reduce among the leaders,
// broadcast back. AVG sums everywhere and the leaders divide by p once, before the broadcast.
static inline void allreduce_hierarchical_leader_plan(Comm* c, HierPlan* h, const void* send, void* recv, size_t count,
                                                      CommType t, CommOp op, HierInter inter) {
    comm_check_args(c, "allreduce_hierarchical_leader", count, t, op, 0);
    if (count == 0) { return; }
    CommVolume before = hier_sent(h);
    CommOp sub = op == COMM_AVG ? COMM_SUM : op;
    bool leader = h->node.rank == 0;
    // The input is read first on c itself, as every algorithm does: on a device communicator
    // that is what orders the call after the caller's work (c's stream, comm_wait_event); the
    // node and cross communicators' streams know nothing of it. Then all of it works in recv.
    comm_copy(c, recv, send, count, t);
    reduce_tree(&h->node, recv, recv, count, t, sub, 0);       // the node's sum, at its leader only
    if (leader) {
        hier_cross_allreduce(h, recv, count, t, sub, inter);
        comm_avg_finish(c, recv, count, t, op, c->size);
    }
    broadcast_tree(&h->node, recv, count, t, 0);
    hier_count(c, h, before);
}

static inline void allreduce_hierarchical_leader(Comm* c, const void* send, void* recv, size_t count, CommType t,
                                                 CommOp op, int node_size, HierInter inter) {
    hier_call_once(c, "allreduce_hierarchical_leader", allreduce_hierarchical_leader_plan, send, recv, count, t, op,
                   node_size, inter);
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

// the leader variant: a tree reduce and a tree broadcast inside the node (root = local index
// 0), and the whole buffer's all-reduce among the leaders
static inline CommVolume allreduce_hierarchical_leader_volume(size_t count, CommType t, int p, int r, int node_size,
                                                              HierInter inter) {
    int n = node_size, l = r % n, m = p / n, k = r / n;
    if (count == 0) { return {0, 0}; }
    CommVolume a = reduce_tree_volume(count, t, n, l, 0);
    CommVolume b = {0, 0};
    if (l == 0) {
        b = inter == HIER_INTER_RING ? allreduce_ring_volume(count, t, m, k) : allreduce_recursive_doubling_volume(count, t, m, k);
    }
    CommVolume g = broadcast_tree_volume(count, t, n, l, 0);
    return {a.bytes + b.bytes + g.bytes, a.messages + b.messages + g.messages};
}
