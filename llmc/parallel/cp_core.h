// What a context-parallel rank holds: its part of every sequence (the plain or zigzag split,
// pictured in cp_ring.h) and the buffers its attention works in. Segment s (s < nseg) of rank r
// is Tseg tokens from global position cp_seg_pos(r, s), at local rows [s Tseg, (s+1) Tseg).
#pragma once

#include <vector>
#include <algorithm>
#include "../model/gpt2.h"
#include "../model/step.h"
#include "../trace.h"
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
    int nseg, Tseg;           // segments per rank (2 zigzag, 1 plain) and their length
    GPT2Step inner;        // the step it wraps (gradient accumulation, or a pipeline schedule)
    MicroBatchSource outer;   // the task's micro-batches (whole sequences), during a step
    std::vector<std::vector<int>> inputs, targets;   // this rank's tokens of each micro-batch
    std::vector<std::vector<float>> weights;
    int* positions;        // device (max_B, Tl): this rank's global positions
    // scratch (device), sized for the model's max_B
    floatX* kv[2];         // ring: the K,V block in hand and the next one (B, Tl, 2C); allgather: kv[0] own
    floatX* kv_all;        // allgather: every rank's block, (cp, B, Tl, 2C)
    float* o_part;         // one block pair's partial output (B, Tseg, C) and lse (B, NH, Tseg)
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

// the split: plain, rank r holds block r; zigzag, chunks r and 2cp-1-r
static inline int cp_seg_pos(const ContextParallel* cp, int r, int s) {
    if (!cp->zigzag) { return r * cp->Tseg; }
    return s == 0 ? r * cp->Tseg : (2 * cp->cp - 1 - r) * cp->Tseg;
}

// visible (query, key) pairs between Tseg queries from qpos and Tseg keys from kpos (causal by position)
static inline double cp_pairs(int qpos, int kpos, int Tseg) {
    double n = 0;
    for (int i = 0; i < Tseg; i++) { n += std::min(std::max(qpos + i - kpos + 1, 0), Tseg); }
    return n;
}
// a key segment entirely after the query segment: nothing to compute
static inline int cp_future(int qpos, int kpos, int Tseg) { return kpos > qpos + Tseg - 1; }

// the ring's neighbours: blocks go to r+1 and come from r-1
static inline int cp_next(const ContextParallel* cp) { return (cp->rank + 1) % cp->cp; }
static inline int cp_prev(const ContextParallel* cp) { return (cp->rank + cp->cp - 1) % cp->cp; }

// the attention op is asked about this rank's Tl tokens per sequence, the length the split was made for
static inline void cp_check_tokens(const ContextParallel* cp, int T) {
    if (T != cp->Tl) { die("context parallelism: attention on %d tokens per sequence, the split was made for %d", T, cp->Tl); }
}

// The cp group's calls: each waits for the compute stream's work so far, is timed into
// cp->seconds and cp->calls and traced (track 4); with use_ring the collectives are ours
// (llmc/comm/ring.h, alltoall.h), whose bytes the communicator counts, else the native ones.
static inline void cp_comm_ready(ContextParallel* cp) {   // the cp stream waits for the compute so far
    backend_event_record(cp->ready);
    comm_wait_event(cp->comm, cp->ready);
}
static inline void cp_end_call(ContextParallel* cp, const char* name, double t0) {
    cp->seconds += trace_now() - t0;
    cp->calls++;
    trace_event(name, 4, t0);
}
