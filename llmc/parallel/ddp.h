// Data parallelism with full replicas: naive all-reduce and bucketed DDP.
//
// Every rank holds all parameters, gradients and optimizer state (Psi parameters, N ranks):
//   memory per rank   (a + a + K) Psi          a = bytes per parameter/gradient, K = optimizer bytes
//                                              (CPU fp32: a = 4, K = 8 (m, v); CUDA bf16: a = 2,
//                                              K = 12 (fp32 master, m, v))
//   traffic per step  all-reduce of the gradients: each rank sends 2 (N-1)/N * a Psi bytes (ring)
// and every rank runs the same AdamW update on the same averaged gradients, so the replicas stay
// identical without ever sending parameters.
//
// naive: after the backward pass of the last micro-step, one all-reduce (average) of the whole
//   flat gradient buffer. Communication waits for all of backward, and backward waits for nothing:
//   the whole all-reduce is exposed.
// bucketed DDP: the gradients live in buckets (dp_core.h); when the last unit of a bucket
//   finishes its backward, the bucket's all-reduce is handed to the communication thread while
//   the backward goes on with the earlier layers. Before the update we wait for all buckets; only
//   what is still running then is exposed. Gradient accumulation: the micro-steps before the last
//   add into the buckets without communicating (like DDP's no_sync()).
//
// The same bucket hooks serve ZeRO-1 and ZeRO-2 (zero.h): there a bucket is reduce-scattered
// instead of all-reduced, and ZeRO-2 frees the bucket once its block has been kept.
#pragma once

#include "dp_core.h"

static inline void zero_reduce_scatter_bucket(DataParallel* dp, int b);   // zero.h

// --- naive

static inline void naive_allreduce_gradients(DataParallel* dp) {
    GPT2* m = dp->model;
    dp_run(dp, "all-reduce gradients", [dp, m] { dp_allreduce_avg(dp, m->grads_memory, m->num_parameters); });
}

// --- bucketed: the backward hooks

static inline void ddp_allreduce_bucket(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "all-reduce bucket %d", b);
    bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk] { dp_allreduce_avg(dp, bk->grad, bk->padded); });
}

// A bucket whose last unit is done goes to the communication thread.
static inline void bucket_unit_done(DataParallel* dp, int unit) {
    int b = dp->unit_bucket[unit];
    Bucket* bk = &dp->buckets[b];
    if (--bk->pending > 0 || !dp->sync) { return; }
    if (dp->mode == DP_DDP) { ddp_allreduce_bucket(dp, b); }
    else { zero_reduce_scatter_bucket(dp, b); }
}

// ZeRO-2 keeps no gradient bucket between steps: one is taken (zeroed) when its first unit
// starts its backward. DDP and ZeRO-1 keep all buckets for the whole run.
// At most DP_MAX_IN_FLIGHT such buckets wait for their reduce-scatter: if communication falls
// behind, the backward waits instead of allocating more (else ZeRO-2 would, at worst, hold as
// much gradient memory as DDP).
#define DP_MAX_IN_FLIGHT 2
static inline floatX* dp_take_grad_bucket(DataParallel* dp, Bucket* bk) {
    while ((int)dp->in_flight.size() >= DP_MAX_IN_FLIGHT) {
        dp_wait(dp, dp->in_flight.front());
        dp->in_flight.pop_front();
    }
    return dp_take(dp, MEM_GRADS, bk->padded, 1);
}
static inline floatX* bucket_grad_buffer(DataParallel* dp, int unit) {
    Bucket* bk = &dp->buckets[dp->unit_bucket[unit]];
    if (bk->grad == NULL) { bk->grad = dp_take_grad_bucket(dp, bk); }
    return bk->grad;
}

static inline void bucket_backward_begin(void* ctx, ParameterTensors* root, ParameterTensors* root_grads) {
    (void)root;
    DataParallel* dp = (DataParallel*)ctx;
    for (Bucket& b : dp->buckets) { b.pending = (int)b.units.size(); }
    dp_root_pointers(dp, bucket_grad_buffer(dp, dp->model->config.num_layers), root_grads);
}
static inline void bucket_block_backward_begin(void* ctx, int l, BlockWeights* w, BlockWeights* grads) {
    (void)w;
    DataParallel* dp = (DataParallel*)ctx;
    dp_block_pointers(dp, l, bucket_grad_buffer(dp, l), grads);
    dp->block_start = trace_now();
}
static inline void bucket_block_backward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    char name[32];
    snprintf(name, sizeof(name), "backward block %d", l);
    trace_event(name, 0, dp->block_start);
    bucket_unit_done(dp, l);
}
static inline void bucket_backward_end(void* ctx) {
    DataParallel* dp = (DataParallel*)ctx;
    bucket_unit_done(dp, dp->model->config.num_layers);
}

static inline void bucket_install_hooks(DataParallel* dp) {
    GPT2Hooks* h = &dp->model->hooks;
    h->ctx = dp;
    h->backward_begin = bucket_backward_begin;
    h->block_backward_begin = bucket_block_backward_begin;
    h->block_backward_end = bucket_block_backward_end;
    h->backward_end = bucket_backward_end;
}
