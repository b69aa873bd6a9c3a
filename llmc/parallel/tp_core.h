// What tensor parallelism's files share: the state (TensorParallel) and the collectives on the
// tp group, with their byte and time counters.
//
//   tp.h             the column- and row-parallel linears and Megatron's f and g (plain TP)
//   sp.h             sequence parallelism: f and g become all-gather and reduce-scatter (g, g-bar)
//   vocab.h          the vocabulary-parallel embedding and cross-entropy
//   tp_accounting.h  the formulas (bytes, parameters, activations) and what the trainer prints
//   tp_zero_bubble.h the column-parallel linear's weight-gradient pass of a zero-bubble pipeline
//
// The collectives run on the compute thread, in order, as Megatron's do on the compute stream:
// each one is on the critical path (no overlap), and its time is the "tp comm" time printed per
// step. Data parallelism's thread may run its own collectives on the dp group at the same time,
// which needs MPI_THREAD_MULTIPLE (llmc/plan/parallel_plan.h asks for it).
#pragma once

#include "../model/gpt2.h"
#include "../trace.h"
#include "../comm/native.h"
#include "../comm/ring.h"

typedef struct TensorParallel {
    Comm* comm;           // the tp group: ranks that share every other mesh coordinate
    int tp, rank;         // its size and this rank's index (= model->place.tp_rank)
    int sp;               // sequence parallelism (the model's place says so too)
    int use_ring;         // 1: our ring collectives (bytes counted), 0: the native ones
    GPT2* model;
    // scratch, reused by every layer (sizes for the model's max_B x max_T)
    floatX* gathered;     // SP: (B, T, C) a gathered input or output gradient
    floatX* full;         // SP: (B, T, C) partial sums before a reduce-scatter, input gradients before one
    float* stats;         // (3 B T) the vocabulary-parallel loss: row max, then (sum of exp, target logit)
    floatX* row;          // (Vp) a whole row of logits, gathered for sampling
    size_t scratch_bytes;
    // measurements of the current step (tp_step_begin resets them)
    uint64_t step_bytes_start;
    double seconds;       // time in tp collectives (all on the critical path)
    int calls;
} TensorParallel;

// ---------------------------------------------------------------------------------------
// The collectives of the tp group, counted (ring) or native, timed.

static inline double tp_begin_call(void) { return trace_now(); }
static inline void tp_end_call(TensorParallel* tp, const char* name, double t0) {
    tp->seconds += trace_now() - t0;
    tp->calls++;
    trace_event(name, 2, t0);   // track 2: tensor-parallel communication (on the compute thread)
}

static inline void tp_allreduce(TensorParallel* tp, const char* name, void* buf, size_t n, CommType t, CommOp op) {
    double t0 = tp_begin_call();
    if (tp->use_ring) { allreduce_ring(tp->comm, buf, buf, n, t, op); }
    else { allreduce_native(tp->comm, buf, buf, n, t, op); }
    tp_end_call(tp, name, t0);
}
// full (n elements, B x T tokens) -> this rank's block of it, summed over the group
static inline void tp_reduce_scatter(TensorParallel* tp, const char* name, const floatX* full, floatX* mine, size_t n) {
    double t0 = tp_begin_call();
    if (tp->use_ring) { reduce_scatter_ring(tp->comm, full, mine, n, COMM_FLOATX, COMM_SUM); }
    else { reduce_scatter_native(tp->comm, full, mine, n, COMM_FLOATX, COMM_SUM); }
    tp_end_call(tp, name, t0);
}
// every rank's block -> full (n elements), in rank order
static inline void tp_allgather(TensorParallel* tp, const char* name, const floatX* mine, floatX* full, size_t n) {
    double t0 = tp_begin_call();
    if (tp->use_ring) { allgather_ring(tp->comm, mine, full, n, COMM_FLOATX); }
    else { allgather_native(tp->comm, mine, full, n, COMM_FLOATX); }
    tp_end_call(tp, name, t0);
}

// the elements of a B x T x C tensor inside the tensor-parallel region (all of the tokens)
static inline size_t tp_full_count(const OpAt* at, int C) { return (size_t)at->B * at->T * C; }
