// Expert parallelism's state (llmc/parallel/ep.h has the picture, the exchanges and the expert
// gradients): what ep.h and ep_accounting.h (the formulas) share.
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
