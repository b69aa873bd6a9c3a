// What context parallelism's files share (the strategy itself is described in cp.h):
//   cp_core.h     the state (ContextParallel), which tokens a rank holds (the plain and zigzag
//                 splits), the attention work they give each rank, the counted and timed
//                 communication of the cp group, the scratch
//   cp_ring.h     ring attention and its all-gather variant: block attention, the merge
//   cp_ulysses.h  the all-to-all variant (DeepSpeed-Ulysses)
//   cp.h          the op in the model, the step wrapped, what the trainer prints
#pragma once

#include <vector>
#include <algorithm>
#include "../model/gpt2.h"
#include "../train/step.h"
#include "../train/trace.h"
#include "../comm/native.h"
#include "../comm/ring.h"
#include "../comm/alltoall.h"

typedef enum { CP_RING = 0, CP_ALLGATHER = 1, CP_ALLTOALL = 2 } CPAlgo;
static const char* CP_ALGO_NAMES[3] = {"ring", "allgather", "alltoall"};

typedef struct ContextParallel {
    Comm* comm;            // the cp group: ranks that share every other mesh coordinate
    int cp, rank;
    CPAlgo algo;
    int zigzag;            // 1: chunks r and 2cp-1-r; 0: block r
    int use_ring;          // allgather / reduce-scatter / all-to-all: ours (bytes counted) or native
    GPT2* model;
    int T, Tl;             // the whole sequence and this rank's part of it
    int nseg, L;           // segments per rank (2 zigzag, 1 plain) and their length
    GPT2Step inner;        // the step it wraps (gradient accumulation, or a pipeline schedule)
    MicroBatchSource outer;   // the task's micro-batches (whole sequences), during a step
    std::vector<std::vector<int>> inputs, targets;   // this rank's tokens of each micro-batch
    std::vector<std::vector<float>> weights;
    int* positions;        // device (max_B, Tl): this rank's global positions
    // scratch (device), sized for the model's max_B
    floatX* kv[2];         // ring: the K,V block in hand and the next one (B, Tl, 2C); allgather: kv[0] own
    floatX* kv_all;        // allgather: every rank's block, (cp, B, Tl, 2C)
    float* o_part;         // one block pair's partial output (B, L, C) and lse (B, NH, L)
    float* lse_part;
    float* delta;          // (B, NH, Tl): dO . O
    float* dq;             // (B, Tl, C) fp32
    float* dkv[4];         // ring: own, the step's, the one in flight, the one received; allgather: [0] own
    float* dkv_all;        // allgather: (cp, B, Tl, 2C) fp32
    floatX* a2a[4];        // alltoall: send, receive, a whole-sequence buffer, another
    void* scratch;
    size_t scratch_bytes;
    BackendEvent ready;    // the compute stream's work so far, for the cp stream to wait on
    // measurements of the current step (cp_step_begin resets them)
    uint64_t step_bytes_start;
    double seconds;        // time in cp communication calls (the ring's: the wait not hidden)
    int calls;
    double pairs;          // (query, key) pairs this rank's attention computed, per head (forward)
    double pairs_step;     // the same, over the current step
} ContextParallel;

static inline CPAlgo cp_algo_parse(const char* s) {
    for (int a = 0; a < 3; a++) { if (strcmp(s, CP_ALGO_NAMES[a]) == 0) { return (CPAlgo)a; } }
    die("--cp-algo must be ring, allgather or alltoall, got '%s'", s);
    return CP_RING;
}

// ---------------------------------------------------------------------------------------
// Which tokens a rank holds: segment s (s < nseg) of rank r is L tokens from global position
// cp_seg_pos(r, s), at local rows [s L, (s+1) L).

static inline int cp_seg_pos(const ContextParallel* cp, int r, int s) {
    if (!cp->zigzag) { return r * cp->L; }
    return s == 0 ? r * cp->L : (2 * cp->cp - 1 - r) * cp->L;
}

// visible (query, key) pairs between L queries from qpos and L keys from kpos (causal by position)
static inline double cp_pairs(int qpos, int kpos, int L) {
    double n = 0;
    for (int i = 0; i < L; i++) { n += std::min(std::max(qpos + i - kpos + 1, 0), L); }
    return n;
}
// a key segment entirely after the query segment: nothing to compute
static inline int cp_future(int qpos, int kpos, int L) { return kpos > qpos + L - 1; }

// the pairs rank r computes in one layer's forward, per sequence and head (what the trainer prints)
static inline double cp_rank_pairs(const ContextParallel* cp, int r) {
    double n = 0;
    for (int s = 0; s < cp->cp; s++) {
        for (int qs = 0; qs < cp->nseg; qs++) {
            for (int ks = 0; ks < cp->nseg; ks++) { n += cp_pairs(cp_seg_pos(cp, r, qs), cp_seg_pos(cp, s, ks), cp->L); }
        }
    }
    return n;
}

// ---------------------------------------------------------------------------------------
// Communication: counted on the cp group, timed, traced (track 4)

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
static inline int cp_next(const ContextParallel* cp) { return (cp->rank + 1) % cp->cp; }
static inline int cp_prev(const ContextParallel* cp) { return (cp->rank + cp->cp - 1) % cp->cp; }

// The group, the split and the scratch for micro-batches of up to B sequences, attention of C
// channels and NH heads on this rank (tp's share): what the op needs (test/test_cp_attention.cu
// drives the op with this alone).
// the split alone (rank `rank` of p), no communicator, no memory: what the formulas read; the
// planner (llmc/planner/cost_model.h) stops here
static inline void cp_shape(ContextParallel* cp, int p, int rank, CPAlgo algo, int zigzag, int T) {
    cp->comm = NULL;
    cp->cp = p;
    cp->rank = rank;
    cp->algo = algo;
    cp->zigzag = zigzag;
    cp->use_ring = 1;
    cp->model = NULL;
    cp->positions = NULL;
    cp->T = T;
    cp->Tl = T / cp->cp;
    cp->nseg = zigzag ? 2 : 1;
    cp->L = cp->Tl / cp->nseg;
}

static inline void cp_setup(ContextParallel* cp, Comm* comm, CPAlgo algo, int zigzag, int T, int B, int C, int NH, int use_ring) {
    cp_shape(cp, comm->size, comm->rank, algo, zigzag, T);
    cp->comm = comm;
    cp->use_ring = use_ring;
    int Tl = cp->Tl;
    size_t E = (size_t)B * Tl * C, lseN = (size_t)B * NH * Tl;
    struct Buf { void** ptr; size_t bytes; };
    std::vector<Buf> bufs;
    memset(cp->kv, 0, sizeof(cp->kv));
    memset(cp->dkv, 0, sizeof(cp->dkv));
    memset(cp->a2a, 0, sizeof(cp->a2a));
    cp->kv_all = NULL;
    cp->dkv_all = NULL;
    cp->o_part = cp->lse_part = cp->delta = cp->dq = NULL;
    if (algo == CP_ALLTOALL) {
        for (int i = 0; i < 4; i++) { bufs.push_back({(void**)&cp->a2a[i], 3 * E * sizeof(floatX)}); }
    } else {
        bufs.push_back({(void**)&cp->kv[0], 2 * E * sizeof(floatX)});
        bufs.push_back({(void**)&cp->o_part, E * sizeof(float)});
        bufs.push_back({(void**)&cp->lse_part, lseN * sizeof(float)});
        bufs.push_back({(void**)&cp->delta, lseN * sizeof(float)});
        bufs.push_back({(void**)&cp->dq, E * sizeof(float)});
        bufs.push_back({(void**)&cp->dkv[0], 2 * E * sizeof(float)});
        if (algo == CP_RING) {
            bufs.push_back({(void**)&cp->kv[1], 2 * E * sizeof(floatX)});
            for (int i = 1; i < 4; i++) { bufs.push_back({(void**)&cp->dkv[i], 2 * E * sizeof(float)}); }
        } else {
            bufs.push_back({(void**)&cp->kv_all, cp->cp * 2 * E * sizeof(floatX)});
            bufs.push_back({(void**)&cp->dkv_all, cp->cp * 2 * E * sizeof(float)});
        }
    }
    size_t total = 0;
    for (const Buf& b : bufs) { total += ceil_div(b.bytes, 64) * 64; }
    cp->scratch = device_malloc(total);
    cp->scratch_bytes = total;
    char* p = (char*)cp->scratch;
    for (const Buf& b : bufs) { *b.ptr = p; p += ceil_div(b.bytes, 64) * 64; }
    cp->ready = backend_event_create();
    cp->seconds = 0.0;
    cp->calls = 0;
    cp->pairs = cp->pairs_step = 0.0;
    cp->step_bytes_start = comm->bytes_sent;
}

static inline void cp_free(ContextParallel* cp) {
    device_free(cp->scratch);
    if (cp->positions) { device_free(cp->positions); }
    backend_event_destroy(cp->ready);
    if (cp->model) { cp->model->positions = NULL; }
}
