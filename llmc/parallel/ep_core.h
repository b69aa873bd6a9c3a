// Expert parallelism's state (llmc/parallel/ep.h has the picture and the exchanges): what ep.h,
// ep_gradients.h (the expert gradients, ep_init) and ep_accounting.h (the formulas) share.
#pragma once

#include <vector>
#include "../model/gpt2.h"
#include "../comm/comm.h"
#include "../comm/native.h"
#include "../comm/alltoall.h"
#include "../comm/ring.h"
#include "dp.h"

typedef struct {
    GPT2* model;
    Comm comm;              // the ep group
    Comm edp;               // the ranks that hold the same experts
    Comm* dp_comm;          // the data-parallel group the two are formed from
    int ep, rank, dp;
    int use_ring;           // ours (pairwise all-to-all-v, ring all-reduce: bytes counted) or native
    MoEExchange xch;
    // the expert tensors' gradients, and their optimizer state
    size_t offset, count;   // the expert tensors' range of the flat buffer
    floatX* grads;
    float *m, *v, *master;
    size_t bytes_state;
    GPT2Hooks hooks;
    BackendEvent ready;     // the compute stream's work so far, for the communicators' streams to wait on
    uint64_t step_start, edp_start;
    double seconds;
} ExpertParallel;

// defined in ep.h: the communicators' streams wait for the compute stream's work so far; the
// experts' exchange and the MLP entries ep_init installs (ep_gradients.h)
static inline void ep_comm_ready(ExpertParallel* ep, Comm* c);
static inline void ep_experts_forward(const MoEExchange* xch, const OpAt* at, MoERouting* r, const floatX* x,
                                      const BlockWeights* w, floatX* y, int C, int H);
static inline void ep_experts_backward(const MoEExchange* xch, const OpAt* at, MoERouting* r, const BlockWeights* w,
                                       BlockWeights* g, floatX* dy, floatX* dx, int C, int H);
static inline void ep_mlp_forward(void* ctx, const OpAt* at, MLPActs* a, const floatX* inp, const BlockWeights* w, int C,
                                  int H);
static inline void ep_mlp_backward(void* ctx, const OpAt* at, floatX* dinp, const floatX* dout, const MLPActs* a,
                                   const floatX* inp, const BlockWeights* w, BlockWeights* g, floatX* dh, int C, int H);
