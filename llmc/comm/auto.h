// Which algorithm when: the `auto` collectives choose one of our algorithms per call.
//
// The lecture gives each all-reduce its cost: alpha log p for recursive doubling (latency-bound:
// small messages), 2 (p-1)/p S beta for the ring and Rabenseifner (bandwidth-optimal: large
// ones). So the best algorithm depends on the size S, the ranks p and the links, and real
// libraries pick one per call (Open MPI's tuned component by size and p, NCCL's tuner ring or
// tree). auto does the same, for all-reduce, reduce-scatter, all-gather and broadcast:
//
//   1. a tuning file (comm_tuning_load; collbench --autotune writes it, llmc/comm/tuning.h) has a
//      row for this primitive, p and size: take its measured winner (a size between two rows:
//      the row nearer in log scale; outside them: the first or the last row);
//   2. otherwise the formulas (alpha_beta.h) decide, with the file's links or, without a file,
//      AUTO_DEFAULT_ALPHA and AUTO_DEFAULT_GBPS: the candidate predicted fastest.
//
//   auto_choose(prim, p, bytes) --> "ring" | "recursive_doubling" | "rabenseifner" | ...
//   allreduce_auto(c, ...)      --> allreduce_<that>(c, ...)        the bytes: <that>'s volume
//
// Every rank chooses the same: the inputs are the same on every rank (the size and p of the
// call, and the table, which rank 0 reads and broadcasts), so no call needs an agreement. The
// hierarchical all-reduce is a candidate only from a file row measured across nodes (NODE < p);
// its sub-communicators are made at its first call on a communicator and kept.
#pragma once

#include <math.h>
#include <string>
#include <vector>
#include "ring.h"
#include "recursive.h"
#include "tree.h"
#include "bruck.h"
#include "hierarchical.h"
#include "tuning.h"

// Without a file: a shared-memory node of a current CPU, to the order of magnitude (collbench
// measures 0.5-2 us and 3-10 GB/s on such machines). Only the crossover sizes depend on them.
static const double AUTO_DEFAULT_ALPHA = 1e-6, AUTO_DEFAULT_GBPS = 5.0;

static CommTuning g_auto_tuning;    // the table in use: none until comm_tuning_load
// The last answer per primitive is kept: a training step, or a benchmark, calls the same size
// again and again, and then the choice costs a comparison, not a search or the formulas. Kept
// per thread (DDP's communication thread calls auto beside the main thread's byte counts), and
// void once comm_tuning_load has counted up the table's generation.
static int g_auto_generation = 1;
struct AutoMemo { int generation, p; size_t bytes; const char* algo; int node; const TuneRow* row; };
static thread_local AutoMemo g_auto_memo[AUTO_NPRIM];

// Reads the tuning file on rank 0 of c and gives its text to every rank (a file on one node's
// disk serves them all). Collective over c. A missing or malformed file: one message naming
// the file and the line, on every rank.
static inline void comm_tuning_load(const Comm* c, const char* path) {
    std::string text;
    long n = 0;
    if (c->rank == 0) {
        FILE* f = fopen(path, "rb");
        if (f) {
            char buf[4096];
            size_t k;
            while ((k = fread(buf, 1, sizeof(buf), f)) > 0) { text.append(buf, k); }
            fclose(f);
            n = (long)text.size();
        } else {
            n = -1;
        }
    }
    MPI_Bcast(&n, 1, MPI_LONG, 0, c->mpi);
    if (n < 0) { comm_die(c, "comm_tuning_load", "cannot read the tuning file '%s' (write one: collbench --autotune)", path); }
    text.resize((size_t)n);
    if (n > 0) { MPI_Bcast(&text[0], (int)n, MPI_CHAR, 0, c->mpi); }
    CommTuning T;
    std::string err;
    if (!tuning_parse(text, &T, &err)) { comm_die(c, "comm_tuning_load", "%s: %s", path, err.c_str()); }
    std::string missing = tuning_covers(T, c->size);
    if (!missing.empty()) { comm_die(c, "comm_tuning_load", "the tuning file '%s' is of no use to auto here: %s", path, missing.c_str()); }
    T.source = path;
    g_auto_tuning = T;
    g_auto_generation++;   // the choices of the old table are void
}

// The links the formulas use: the file's (one node: its intra link; nodes of one rank: inter),
// else the defaults. p ranks on one node (the rows measured across nodes carry their own choice).
static inline CommLinks auto_links(const CommTuning& T, int p) {
    CommLinks L;
    L.a = AUTO_DEFAULT_ALPHA;
    L.b = 1e-9 / AUTO_DEFAULT_GBPS;
    if (T.have_intra) { L.a = T.intra_alpha_us * 1e-6; L.b = 1e-9 / T.intra_gbps; }
    else if (T.have_inter) { L.a = T.inter_alpha_us * 1e-6; L.b = 1e-9 / T.inter_gbps; }
    L.a2 = L.a;
    L.b2 = L.b;
    L.bx = L.b;
    L.node = p;
    L.spans = false;
    return L;
}

// The formula of one candidate (node: ranks per node, for hierarchical)
static inline double auto_model(int prim, const std::string& algo, const CommLinks& L, double S, int p, int node) {
    if (prim == AUTO_ALLREDUCE) {
        if (algo == "ring") { return ab_ring_ar(L, S, p); }
        if (algo == "recursive_doubling") { return ab_rd_ar(L, S, p); }
        if (algo == "rabenseifner") { return ab_raben(L, S, p); }
        if (algo == "hierarchical") { return ab_hier(L, S, p, node); }
    }
    if (prim == AUTO_REDUCE_SCATTER) { return algo == "ring" ? ab_ring_rs(L, S, p) : ab_rh_rs(L, S, p); }
    if (prim == AUTO_ALLGATHER) {
        if (algo == "ring") { return ab_ring_rs(L, S, p); }
        if (algo == "recursive_doubling") { return ab_rh_rs(L, S, p); }
        if (algo == "bruck") { return ab_bruck_ag(L, S, p); }
    }
    if (prim == AUTO_BROADCAST) { return algo == "ring" ? ab_ring_bcast(L, S, p) : ab_tree(L, S, p); }
    return INFINITY;
}

// The candidate the formulas predict fastest (the first of equals); hierarchical only when the
// links span nodes of `node` ranks
static inline const char* auto_predict(int prim, const CommLinks& L, double S, int p) {
    const char* best = "";
    double tbest = INFINITY;
    for (const std::string& a : AUTO_CANDIDATES[prim]) {
        if (a == "hierarchical" && !(L.spans && L.node > 1 && L.node < p)) { continue; }
        double t = auto_model(prim, a, L, S, p, L.node);
        if (t < tbest) { tbest = t; best = a.c_str(); }
    }
    return best;
}

// auto's choice for `bytes` (the full buffer, as collbench counts it) on p ranks; *node: the
// ranks per node of the file row it came from (hierarchical), else p; *row: that row or NULL.
// Called on every collective: a row that holds the size is found without arithmetic, and the
// names are the table's own strings (no allocation).
static inline const char* auto_choose_uncached(int prim, int p, size_t bytes, int* node, const TuneRow** row) {
    const TuneRow* best = NULL;
    for (const TuneRow& r : g_auto_tuning.rows) {
        if (r.prim == prim && r.p == p && r.lo <= bytes && bytes <= r.hi) { best = &r; break; }
    }
    if (!best) {     // between rows or outside them: the nearest in log scale
        double dist = INFINITY, lb = log((double)std::max(bytes, (size_t)1));
        for (const TuneRow& r : g_auto_tuning.rows) {
            if (r.prim != prim || r.p != p) { continue; }
            double d = bytes < r.lo ? log((double)r.lo) - lb : lb - log((double)std::max(r.hi, (size_t)1));
            if (d < dist) { dist = d; best = &r; }
        }
    }
    if (row) { *row = best; }
    if (best) { *node = best->node; return best->measured.c_str(); }
    *node = p;
    return auto_predict(prim, auto_links(g_auto_tuning, p), (double)bytes, p);
}

// ... the same, the last answer per primitive and thread kept (g_auto_memo)
static inline const char* auto_choose(int prim, int p, size_t bytes, int* node, const TuneRow** row) {
    AutoMemo& m = g_auto_memo[prim];
    if (m.generation != g_auto_generation || m.p != p || m.bytes != bytes) {
        m.algo = auto_choose_uncached(prim, p, bytes, &m.node, &m.row);
        m.generation = g_auto_generation;
        m.p = p;
        m.bytes = bytes;
    }
    *node = m.node;
    if (row) { *row = m.row; }
    return m.algo;
}

// the hierarchical all-reduce's sub-communicators, made at its first call on a communicator
struct AutoHierPlan { MPI_Comm mpi; int node; HierPlan plan; };
static std::vector<AutoHierPlan> g_auto_hier;
static inline HierPlan* auto_hier_plan(Comm* c, int node) {
    for (AutoHierPlan& h : g_auto_hier) { if (h.mpi == c->mpi && h.node == node) { return &h.plan; } }
    g_auto_hier.push_back({c->mpi, node, hier_plan_make(c, "allreduce_auto (hierarchical)", node)});
    return &g_auto_hier.back().plan;
}

static inline void allreduce_auto(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    int node;
    const char* a = auto_choose(AUTO_ALLREDUCE, c->size, count * comm_type_size(t), &node, NULL);
    if (strcmp(a, "ring") == 0) { allreduce_ring(c, send, recv, count, t, op); }
    else if (strcmp(a, "recursive_doubling") == 0) { allreduce_recursive_doubling(c, send, recv, count, t, op); }
    else if (strcmp(a, "rabenseifner") == 0) { allreduce_rabenseifner(c, send, recv, count, t, op); }
    else { allreduce_hierarchical_plan(c, auto_hier_plan(c, node), send, recv, count, t, op, HIER_INTER_RING); }
}
// count: the full (unreduced) buffer's elements, as reduce_scatter_ring
static inline void reduce_scatter_auto(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    int node;
    const char* a = auto_choose(AUTO_REDUCE_SCATTER, c->size, count * comm_type_size(t), &node, NULL);
    if (strcmp(a, "ring") == 0) { reduce_scatter_ring(c, send, recv, count, t, op); }
    else { reduce_scatter_recursive_halving(c, send, recv, count, t, op); }
}
// count: the full (gathered) buffer's elements, as allgather_ring
static inline void allgather_auto(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    int node;
    const char* a = auto_choose(AUTO_ALLGATHER, c->size, count * comm_type_size(t), &node, NULL);
    if (strcmp(a, "ring") == 0) { allgather_ring(c, send, recv, count, t); }
    else if (strcmp(a, "recursive_doubling") == 0) { allgather_recursive_doubling(c, send, recv, count, t); }
    else { allgather_bruck(c, send, recv, count, t); }
}
static inline void broadcast_auto(Comm* c, void* buf, size_t count, CommType t, int root) {
    int node;
    const char* a = auto_choose(AUTO_BROADCAST, c->size, count * comm_type_size(t), &node, NULL);
    if (strcmp(a, "ring") == 0) { broadcast_ring(c, buf, count, t, root); }
    else { broadcast_tree(c, buf, count, t, root); }
}

// What an auto call sends from rank r: the chosen algorithm's volume
static inline CommVolume allreduce_auto_volume(size_t count, CommType t, int p, int r) {
    int node;
    const char* a = auto_choose(AUTO_ALLREDUCE, p, count * comm_type_size(t), &node, NULL);
    if (strcmp(a, "ring") == 0) { return allreduce_ring_volume(count, t, p, r); }
    if (strcmp(a, "recursive_doubling") == 0) { return allreduce_recursive_doubling_volume(count, t, p, r); }
    if (strcmp(a, "rabenseifner") == 0) { return allreduce_rabenseifner_volume(count, t, p, r); }
    return allreduce_hierarchical_volume(count, t, p, r, node, HIER_INTER_RING);
}
static inline CommVolume reduce_scatter_auto_volume(size_t count, CommType t, int p, int r) {
    int node;
    const char* a = auto_choose(AUTO_REDUCE_SCATTER, p, count * comm_type_size(t), &node, NULL);
    return strcmp(a, "ring") == 0 ? reduce_scatter_ring_volume(count, t, p, r) : reduce_scatter_recursive_halving_volume(count, t, p, r);
}
static inline CommVolume allgather_auto_volume(size_t count, CommType t, int p, int r) {
    int node;
    const char* a = auto_choose(AUTO_ALLGATHER, p, count * comm_type_size(t), &node, NULL);
    if (strcmp(a, "ring") == 0) { return allgather_ring_volume(count, t, p, r); }
    if (strcmp(a, "recursive_doubling") == 0) { return allgather_recursive_doubling_volume(count, t, p, r); }
    return allgather_bruck_volume(count, t, p, r);
}
static inline CommVolume broadcast_auto_volume(size_t count, CommType t, int p, int r, int root) {
    int node;
    const char* a = auto_choose(AUTO_BROADCAST, p, count * comm_type_size(t), &node, NULL);
    return strcmp(a, "ring") == 0 ? broadcast_ring_volume(count, t, p, r, root, 0) : broadcast_tree_volume(count, t, p, r, root);
}
