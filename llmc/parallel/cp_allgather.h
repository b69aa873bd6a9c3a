// Context parallelism by all-gather (--cp-algo allgather): the lecture's drawing "Transformer
// Layer with TP+CP" (LLM Pre-training and Beyond, after Megatron-Core's context-parallel guide):
// an all-gather (AG) of the keys and values before attention, a reduce-scatter (RS) of their
// gradients after its backward; Llama 3 trains this way (Dubey et al. 2024, "The Llama 3 Herd
// of Models").
//
//     rank r:  K_r,V_r --AG--> K,V of the whole sequence --> Q_r . K,V --> O_r
//     backward:  dQ_r stays;  dK,dV of every block --RS--> each owner sums its own
//
// The gathered blocks run through the same block kernels and merge as the ring (cp_ring.h):
// softmax over all the keys, computed block by block (the same result as one softmax up to the
// order of the sums), so the two differ only in how K and V arrive. Nothing overlaps the
// collectives, and the whole sequence's K, V and their fp32 gradients are in memory; the bytes
// are the ring's (cp - 1 blocks of K,V each way).
#pragma once

#include "cp_ring.h"

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

// the saved state per layer, as the ring's: O (B, Tl, C) fp32, then lse (B, NH, Tl)
static inline void cp_allgather_forward(void* ctx, const OpAt* at, floatX* out, float* state, const floatX* qkv, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    int B = at->B, Tl = cp->Tl;
    size_t n = (size_t)B * Tl * 2 * C;   // one rank's K,V block
    float* o_acc = state;
    float* lse_acc = state + (size_t)B * Tl * C;
    fill_floats(o_acc, 0.0f, (size_t)B * Tl * C);
    fill_floats(lse_acc, -INFINITY, (size_t)B * NH * Tl);
    copy_rows(cp->kv[0], Tl, 2 * C, qkv + C, Tl, 3 * C, B, Tl, 2 * C);   // pack this rank's k | v
    cp_allgather(cp, "CP all-gather K,V", cp->kv[0], cp->kv_all, n, COMM_FLOATX);
    for (int s = 0; s < cp->cp; s++) { cp_block_forward(cp, B, o_acc, lse_acc, qkv, cp->kv_all + s * n, s, C, NH); }
    store_rows(out, Tl, C, o_acc, Tl, C, B, Tl, C);
}

// the whole sequence's K,V again, every block's dK,dV, reduce-scatter to the owners
static inline void cp_allgather_backward(void* ctx, const OpAt* at, floatX* dqkv, const floatX* dout, const floatX* qkv,
                                         const float* state, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    int B = at->B, Tl = cp->Tl;
    size_t n = (size_t)B * Tl * 2 * C;
    const float* o = state;
    const float* lse = state + (size_t)B * Tl * C;
    attention_block_delta(cp->delta, dout, o, B, Tl, C, NH);
    fill_floats(cp->dq, 0.0f, (size_t)B * Tl * C);
    float* dkv_own = cp->dkv[0];
    copy_rows(cp->kv[0], Tl, 2 * C, qkv + C, Tl, 3 * C, B, Tl, 2 * C);
    cp_allgather(cp, "CP all-gather K,V", cp->kv[0], cp->kv_all, n, COMM_FLOATX);
    fill_floats(cp->dkv_all, 0.0f, n * cp->cp);
    for (int s = 0; s < cp->cp; s++) {
        cp_block_backward(cp, B, cp->dq, cp->dkv_all + s * n, dout, lse, qkv, cp->kv_all + s * n, s, C, NH);
    }
    cp_reduce_scatter(cp, "CP reduce-scatter dK,dV", cp->dkv_all, dkv_own, n, COMM_FP32);
    store_rows(dqkv, Tl, 3 * C, cp->dq, Tl, C, B, Tl, C);
    store_rows(dqkv + C, Tl, 3 * C, dkv_own, Tl, 2 * C, B, Tl, 2 * C);
}
