// ZeRO: data parallelism without the replicas' redundancy (Rajbhandari et al., 2020).
// N ranks, Psi parameters (Psi_pad after padding each bucket to a multiple of N), a bytes per
// parameter/gradient, K bytes of optimizer state per parameter (CPU fp32: a = 4, K = 8 for m, v;
// CUDA bf16: a = 2, K = 12 for the fp32 master copy, m, v). Rank r owns block r of every bucket.
//
//             sharded                     memory per rank              traffic per step per rank
//   ZeRO-1    optimizer state             2a Psi + K Psi/N              RS + AG = 2 (N-1)/N a Psi
//   ZeRO-2    + gradients                 a Psi + (a + K) Psi/N         RS per micro-step + AG
//   ZeRO-3    + parameters                (2a + K) Psi/N                per micro-step: AG params
//                                         + one gathered block           (forward), AG again
//                                                                        (backward), RS grads:
//                                                                        3 (N-1)/N a Psi
// (RS = reduce-scatter, AG = all-gather; an all-reduce is exactly RS + AG, so ZeRO-1/2 move the
// same bytes as DDP.) This file: ZeRO-1 and ZeRO-2, on DDP's buckets and hooks (buckets.h);
// their formulas are in dp_accounting.h. ZeRO-3 is dp_zero3.h; offload.h moves ZeRO-1/2's
// optimizer to the host.
//
// ZeRO-1: the gradient buckets are kept whole (as DDP); when a bucket is ready it is
//   reduce-scattered in place, so this rank's block holds the averaged gradient of the
//   parameters it owns. Each rank runs AdamW on its block only (its m, v, master weights), then
//   every bucket's parameters are all-gathered back into the full parameter buffer.
// ZeRO-2: a gradient bucket exists only while in flight: taken when its first unit starts the
//   backward, reduce-scattered when its last unit ends, this rank's block added into the
//   persistent gradient shard, the bucket released. With gradient accumulation this happens on
//   every micro-step (there is no full gradient buffer to accumulate into).
#pragma once

#include "buckets.h"
#include "dp_accounting.h"

static inline void zero1_init(DataParallel* dp) {
    buckets_init(dp, 1);
    bucket_install_hooks(dp, "data parallel: ZeRO-1 buckets");
}
static inline void zero2_init(DataParallel* dp) {
    buckets_init(dp, 2);
    bucket_install_hooks(dp, "data parallel: ZeRO-2 buckets");
}

// --- gradients: reduce-scatter a ready bucket

// ZeRO-1: in place, in the bucket that persists
static inline void zero1_reduce_scatter_bucket(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "reduce-scatter bucket %d", b);
    bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk] { dp_reduce_scatter_avg(dp, bk->grad, bk->padded); });
}
// ZeRO-2 (and ZeRO-3): the bucket is handed over to the communication thread, which adds this
// rank's block into the gradient shard and releases the bucket
static inline void zero2_reduce_scatter_bucket(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "reduce-scatter bucket %d", b);
    floatX* buf = bk->grad;
    bk->grad = NULL;
    bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk, buf] {
        dp_reduce_scatter_avg(dp, buf, bk->padded);
        floatX* mine = buf + (size_t)dp->rank * bk->shard;
        residual_forward(bk->grad_shard, bk->grad_shard, mine, bk->shard);   // accumulate micro-steps
        dp_give(dp, MEM_GRADS, buf, bk->padded);
    });
    dp->in_flight.push_back(bk->reduce_ticket);
}

// --- after the update: every rank's updated block goes to everyone

static inline void zero_allgather_parameters(DataParallel* dp) {
    GPT2* m = dp->model;
    for (size_t b = 0; b < dp->buckets.size(); b++) {
        Bucket* bk = &dp->buckets[b];
        bk->param_full = dp_take(dp, MEM_COMM, bk->padded, 0);
        size_t lo = (size_t)dp->rank * bk->shard;
        dp_copy_range(bk, m->params_memory, bk->param_full, lo, lo + bk->shard, 1);
        char name[64];
        snprintf(name, sizeof(name), "all-gather params %zu", b);
        bk->gather_ticket = dp_enqueue(dp, name, [dp, bk] { dp_allgather(dp, bk->param_full, bk->padded); });
    }
    for (size_t b = 0; b < dp->buckets.size(); b++) {
        Bucket* bk = &dp->buckets[b];
        dp_wait(dp, bk->gather_ticket);
        dp_copy_range(bk, m->params_memory, bk->param_full, 0, bk->count, 0);
        dp_give(dp, MEM_COMM, bk->param_full, bk->padded);
        bk->param_full = NULL;
    }
}

// the owners are disjoint: the norm's parts are summed over the ranks
static inline float zero_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                                float grad_clip) {
    float norm = dp_update_owned(dp, lr, beta1, beta2, eps, weight_decay, grad_clip);
    zero_allgather_parameters(dp);
    return norm;
}

static const DPModeOps DP_MODE_ZERO1 = {
    "ZeRO-1", "ddp", 1,   // name, --dp-mode, --zero
    0, 0, "",             // reduce_every_micro, always_counted, comm_note
    zero1_init, buckets_zero_grad, zero_update,
    zero1_reduce_scatter_bucket,
    NULL, NULL,           // full_model_begin/end: the parameters are whole after every update
    zero1_formula_bytes, zero1_formula_memory,
    1,                    // owners_disjoint
};
static const DPModeOps DP_MODE_ZERO2 = {
    "ZeRO-2", "ddp", 2,
    1, 0, "",             // reduce every micro-step: no full gradient buffer to accumulate in
    zero2_init, buckets_zero_grad, zero_update,
    zero2_reduce_scatter_bucket,
    NULL, NULL,
    zero2_formula_bytes, zero2_formula_memory,
    1,                    // owners_disjoint
};
