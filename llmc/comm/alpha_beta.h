// The alpha-beta models of the collective algorithms (the formulas in the header of each
// algorithm's file, put on the links they use): predicted seconds for S bytes on p ranks.
// collbench prints them beside every measured time; the `auto` collectives (auto.h) pick the
// algorithm they predict fastest when no tuning file says otherwise.
//
// alpha is the time of a message, beta the time per byte, on the link a step uses: inside a
// node (a, b) or between nodes (a2, b2). What they leave out (collbench --autotune names it where
// the measured winner differs from the predicted one): the local reduction's compute (gamma per
// byte reduced), the copies an algorithm makes, and how a transport segments and progresses
// long messages.
#pragma once

#include <algorithm>
#include <math.h>
#include <vector>
#include "recursive.h"      // Fold: the fold of p that is not a power of two
#include "ring.h"           // RING_BROADCAST_CHUNK_BYTES

// The links the model uses, measured by collbench's ping-pong (see "Nodes and links" at the top of dev/collbench/collbench.cu):
// inside a node (a, b) and between nodes (a2, b2), seconds per message and per byte. On one
// node, or when the nodes are irregular, there is one link: a2 = a, b2 = b, node = p, and
// every formula below reduces to its one-link form.
struct CommLinks {
    double a, b;       // inside a node
    double a2, b2;     // between nodes
    double bx;         // between nodes, a pair exchanging (both ways at once): per byte, each
                       // way; measured when the ranks span nodes, else = b2 (nothing changes)
    int node;          // ranks per node: node k = ranks [k node, (k+1) node); p on one node
    bool spans;        // the ranks span several nodes of `node` ranks each
};
// The alpha-beta model: predicted seconds for S bytes on p ranks.

// One step of `bytes` per rank, inside a node or between nodes. Between nodes, `flows` ranks
// of a node send across at the same time, and they share the node's one network link: each
// sees flows x beta' per byte. The assumption, made once here: a node has ONE network link
// (our namespaces' veth, a node with one NIC). A node with one NIC per GPU (a DGX: 8 GPUs,
// 8 NICs) gives each flow its own link, and there the factor would be 1.
static inline double ab_intra(const CommLinks& L, double bytes) { return L.a + bytes * L.b; }
static inline double ab_inter(const CommLinks& L, double bytes, int flows) { return L.a2 + bytes * L.b2 * flows; }
// The same step when it is an exchange: each of the `flows` crossing ranks of a node swaps its
// bytes with ONE peer on another node (sendrecv, both directions at once), priced with the
// measured beta_x instead of beta'. The sharing factor multiplies as for one-way steps: the
// node's `flows` exchanging pairs split what one pair gets (measured on the emulated cluster,
// 2 x 2, 16 MiB: two pairs exchanging at once took 2.1 to 4 times a one-way transfer, mostly
// about 3; flows x beta_x with beta_x = 2 beta' says 4, flows x beta' says 2).
// The steps priced so (all only when the ranks span nodes):
//   - every step of the flat ring (reduce-scatter, all-gather, all-reduce) when p = 2: the
//     left and right neighbours are the same rank on the other node;
//   - hierarchical step 2 and the leaders' ring of hierarchical_leader when m = 2 nodes (a
//     ring of 2), for a schedule whose nodes are the machine's (torus2d likewise);
//   - the butterfly steps of recursive doubling/halving and Rabenseifner whose partners sit on
//     different nodes (v and v XOR mask send to each other).
// Not exchanges: a ring of more than 2 (left != right: different processes drive the two
// directions of a link), the fold steps of a p that is not a power of two (one way), the tree,
// the pipelined broadcast. Pairwise and Bruck all-to-all have an exchange step too (distance
// p/2), but their models are a one-flow bound on the slow link and stay one-way.
static inline double ab_inter_x(const CommLinks& L, double bytes, int flows) { return L.a2 + bytes * L.bx * flows; }

static inline int ab_floor_log2(int p) { int l = 0; while ((2 << l) <= p) { l++; } return l; }
static inline int ab_ceil_log2(int p) { int l = 0; while ((1 << l) < p) { l++; } return l; }
static inline bool ab_pow2(int p) { return (p & (p - 1)) == 0; }

// ring.h. A flat ring over nodes of consecutive ranks: in every step the last rank of each node
// sends to the next node's first (one flow leaves each node), so every step takes the slow
// link's time: 2 (p-1) (alpha' + S/p beta') for the all-reduce. On one node: the one link.
// p = 2 on two nodes: every step is an exchange (beta_x).
static inline double ab_ring_rs(const CommLinks& L, double S, int p) {
    return (p - 1) * (L.spans && p == 2 ? ab_inter_x(L, S / p, 1) : ab_inter(L, S / p, 1));
}
static inline double ab_ring_ar(const CommLinks& L, double S, int p) { return 2.0 * ab_ring_rs(L, S, p); }
static inline double ab_ring_bcast(const CommLinks& L, double S, int p) {     // the chain crosses every node boundary
    double C = std::min(S, (double)RING_BROADCAST_CHUNK_BYTES);
    double chunks = C > 0 ? ceil(S / C) : 0;
    return (p - 1 + chunks - 1) * ab_inter(L, C, 1);
}
// tree.h: every round on the slow link (a round whose pairs all stay inside nodes is charged
// as if it crossed: an upper bound, exact on one node)
static inline double ab_tree(const CommLinks& L, double S, int p) { return ab_ceil_log2(p) * ab_inter(L, S, 1); }

// recursive.h. The butterfly pairs virtual rank v with v XOR mask, mask = 1, 2, 4, .. (doubling)
// or .., 2, 1 (halving); with nodes of n consecutive ranks (n a power of two, p too) the steps
// with mask >= n cross nodes, all n ranks of a node at once. The fold (p not a power of two)
// moves the real ranks, so walk the pairs: a step's time is that of its slowest link, the
// busiest node's `flows` sharing the slow one. Every butterfly step is an exchange (beta_x).
static inline double ab_butterfly_step(const CommLinks& L, int p, int mask, double bytes) {
    if (!L.spans) { return ab_intra(L, bytes); }
    Fold f = fold_make(p, 0);
    std::vector<int> out(p / L.node, 0);
    int flows = 0;
    for (int v = 0; v < f.p2; v++) {
        int x = fold_real(f, v), y = fold_real(f, v ^ mask);
        if (x / L.node != y / L.node) { flows = std::max(flows, ++out[x / L.node]); }
    }
    return flows > 0 ? ab_inter_x(L, bytes, flows) : ab_intra(L, bytes);
}
// the fold-in and fold-out of p that is not a power of two: one whole-buffer step each, even
// r < 2 rem with r + 1
static inline double ab_fold_cost(const CommLinks& L, double S, int p) {
    if (ab_pow2(p)) { return 0.0; }
    Fold f = fold_make(p, 0);
    std::vector<int> out(p / L.node, 0);
    int flows = 0;
    for (int r = 0; r < 2 * f.rem; r += 2) {
        if (L.spans && r / L.node != (r + 1) / L.node) { flows = std::max(flows, ++out[r / L.node]); }
    }
    return 2.0 * (flows > 0 ? ab_inter(L, S, flows) : ab_intra(L, S));
}
static inline double ab_rd_ar(const CommLinks& L, double S, int p) {          // whole buffers, mask 1, 2, 4, ..
    double t = ab_fold_cost(L, S, p);
    for (int mask = 1; mask < (1 << ab_floor_log2(p)); mask *= 2) { t += ab_butterfly_step(L, p, mask, S); }
    return t;
}
// halving reduce-scatter (mask p2/2 with S/2 first, .., mask 1 with S/p2) and doubling
// all-gather (the same pairs in reverse): at distance mask a rank sends S mask / p2
static inline double ab_rh_rs(const CommLinks& L, double S, int p) {
    int p2 = 1 << ab_floor_log2(p);
    double t = ab_fold_cost(L, S, p);
    for (int mask = 1; mask < p2; mask *= 2) { t += ab_butterfly_step(L, p, mask, S * mask / p2); }
    return t;
}
static inline double ab_raben(const CommLinks& L, double S, int p) {           // halving + doubling, one fold
    return 2.0 * ab_rh_rs(L, S, p) - ab_fold_cost(L, S, p);
}

// alltoall.h, bruck.h (S = the p blocks a rank sends; n = S/p per pair): the slow link
static inline double ab_pairwise(const CommLinks& L, double S, int p) { return (p - 1) * ab_inter(L, S / p, 1); }
static inline double ab_bruck_ag(const CommLinks& L, double S, int p) { return ab_ceil_log2(p) * L.a2 + (p - 1.0) / p * S * L.b2; }
static inline double ab_bruck_a2a(const CommLinks& L, double S, int p) { return ab_ceil_log2(p) * ab_inter(L, S / 2, 1); }

// hierarchical.h with a schedule of nodes of n ranks, m = p/n of them. When the schedule's
// nodes are the machine's (n = L.node): steps 1 and 3 inside a node, step 2 between nodes with
// all n ranks of a node crossing at once (n flows on the node's one link). On one node: the
// one link everywhere, one flow. A schedule whose nodes are not the machine's (-N not the
// node size): every step on the slow link, one flow, one-way (a lower bound; say so in the
// header). Step 2 on m = 2 machine nodes is a ring of 2, an exchange: beta_x.
static inline void ab_hier_links(const CommLinks& L, int n, CommLinks* in, int* flows) {
    bool machine_nodes = L.spans && n == L.node;
    *in = L;
    if (L.spans && !machine_nodes) { in->a = L.a2; in->b = L.b2; }
    *flows = machine_nodes ? n : 1;
}
// step 2, one of its 2 (m-1) ring steps: `bytes` per rank, `flows` ranks of a node at once
static inline double ab_hier_cross(const CommLinks& L, int n, int m, double bytes, int flows) {
    bool exchange = L.spans && n == L.node && m == 2;
    return exchange ? ab_inter_x(L, bytes, flows) : ab_inter(L, bytes, flows);
}
// reduce-scatter -> all-reduce (ring, S/n each) -> all-gather
static inline double ab_hier(const CommLinks& L, double S, int p, int n) {
    int m = p / n, flows;
    CommLinks in;
    ab_hier_links(L, n, &in, &flows);
    return 2 * (n - 1) * ab_intra(in, S / n) + 2 * (m - 1) * ab_hier_cross(L, n, m, S / n / m, flows);
}
// the leader variant: tree reduce -> all-reduce among the leaders (ring, the whole buffer, one
// flow per node) -> tree broadcast
static inline double ab_leader(const CommLinks& L, double S, int p, int n) {
    int m = p / n, flows;
    CommLinks in;
    ab_hier_links(L, n, &in, &flows);
    return 2 * ab_ceil_log2(n) * ab_intra(in, S) + 2 * (m - 1) * ab_hier_cross(L, n, m, S / m, 1);
}
