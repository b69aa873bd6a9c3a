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
// same bytes as DDP.)
//
// ZeRO-1: the gradient buckets are kept whole (as DDP); when a bucket is ready it is
//   reduce-scattered in place, so this rank's block holds the averaged gradient of the
//   parameters it owns. Each rank runs AdamW on its block only (its m, v, master weights), then
//   every bucket's parameters are all-gathered back into the full parameter buffer.
// ZeRO-2: a gradient bucket exists only while in flight: taken when its first unit starts the
//   backward, reduce-scattered when its last unit ends, this rank's block added into the
//   persistent gradient shard, the bucket released. With gradient accumulation this happens on
//   every micro-step (there is no full gradient buffer to accumulate into).
// ZeRO-3 (FSDP): one bucket per unit (transformer block, or the root: embeddings + final
//   layernorm), and only the parameter shards persist. Before block l's forward its
//   parameters are all-gathered (the gather of block l+1 is started at the same time: the
//   prefetch), after it they are freed; the backward gathers them again (prefetching l-1),
//   computes the block's gradients into a temporary bucket, frees the parameters, and
//   reduce-scatters the gradients into the shard. The root unit stays gathered from the start
//   of the forward to the end of the backward (wte is both the first and the last layer).
//   Evaluation and checkpoints gather the full parameters once (zero3_materialize).
#pragma once

#include "ddp.h"

// --- gradients: reduce-scatter a ready bucket (ZeRO-1, 2, 3)

static inline void zero_reduce_scatter_bucket(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "reduce-scatter bucket %d", b);
    if (dp->mode == DP_ZERO1) {
        bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk] { dp_reduce_scatter_avg(dp, bk->grad, bk->padded); });
        return;
    }
    floatX* buf = bk->grad;   // ZeRO-2/3: the bucket is handed over and released after
    bk->grad = NULL;
    bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk, buf] {
        dp_reduce_scatter_avg(dp, buf, bk->padded);
        floatX* mine = buf + (size_t)dp->rank * bk->shard;
        residual_forward(bk->grad_shard, bk->grad_shard, mine, bk->shard);   // accumulate micro-steps
        dp_give(dp, MEM_GRADS, buf, bk->padded);
    });
    dp->in_flight.push_back(bk->reduce_ticket);
}

// --- ZeRO-3: parameters gathered just in time

static inline void zero3_gather(DataParallel* dp, int b) {   // start (no wait); no-op when alive
    Bucket* bk = &dp->buckets[b];
    if (bk->param_full != NULL) { return; }
    bk->param_full = dp_take(dp, MEM_COMM, bk->padded, 0);
    floatX* full = bk->param_full;
    char name[64];
    snprintf(name, sizeof(name), "all-gather params %d", b);
    bk->gather_ticket = dp_enqueue(dp, name, [dp, bk, full] {
        copy_device_to_device(full + (size_t)dp->rank * bk->shard, bk->param_shard, bk->shard * sizeof(floatX));
        dp_allgather(dp, full, bk->padded);
    });
}
static inline floatX* zero3_ensure(DataParallel* dp, int b) {
    zero3_gather(dp, b);
    dp_wait(dp, dp->buckets[b].gather_ticket);
    return dp->buckets[b].param_full;
}
static inline void zero3_release(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    if (bk->param_full == NULL) { return; }
    dp_give(dp, MEM_COMM, bk->param_full, bk->padded);
    bk->param_full = NULL;
}

static inline void zero3_forward_begin(void* ctx, ParameterTensors* root) {
    DataParallel* dp = (DataParallel*)ctx;
    int L = dp->model->config.num_layers;
    dp_root_pointers(dp, zero3_ensure(dp, dp->unit_bucket[L]), root);
    zero3_gather(dp, dp->unit_bucket[0]);   // prefetch block 0
}
static inline void zero3_block_forward_begin(void* ctx, int l, BlockWeights* w) {
    DataParallel* dp = (DataParallel*)ctx;
    dp_block_pointers(dp, l, zero3_ensure(dp, dp->unit_bucket[l]), w);
    if (l + 1 < dp->model->config.num_layers) { zero3_gather(dp, dp->unit_bucket[l + 1]); }   // prefetch
}
static inline void zero3_block_forward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    zero3_release(dp, dp->unit_bucket[l]);
}
static inline void zero3_backward_begin(void* ctx, ParameterTensors* root, ParameterTensors* root_grads) {
    DataParallel* dp = (DataParallel*)ctx;
    int L = dp->model->config.num_layers;
    Bucket* rb = &dp->buckets[dp->unit_bucket[L]];
    dp_root_pointers(dp, zero3_ensure(dp, dp->unit_bucket[L]), root);
    rb->grad = dp_take_grad_bucket(dp, rb);
    dp_root_pointers(dp, rb->grad, root_grads);
    zero3_gather(dp, dp->unit_bucket[L - 1]);   // prefetch the last block
}
static inline void zero3_block_backward_begin(void* ctx, int l, BlockWeights* w, BlockWeights* grads) {
    DataParallel* dp = (DataParallel*)ctx;
    int b = dp->unit_bucket[l];
    dp_block_pointers(dp, l, zero3_ensure(dp, b), w);
    if (l > 0) { zero3_gather(dp, dp->unit_bucket[l - 1]); }   // prefetch
    dp->buckets[b].grad = dp_take_grad_bucket(dp, &dp->buckets[b]);
    dp_block_pointers(dp, l, dp->buckets[b].grad, grads);
}
static inline void zero3_block_backward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    int b = dp->unit_bucket[l];
    zero3_release(dp, b);
    zero_reduce_scatter_bucket(dp, b);
}
static inline void zero3_backward_end(void* ctx) {
    DataParallel* dp = (DataParallel*)ctx;
    int b = dp->unit_bucket[dp->model->config.num_layers];
    zero_reduce_scatter_bucket(dp, b);
    zero3_release(dp, b);
}

static inline void zero3_install_hooks(DataParallel* dp) {
    GPT2Hooks* h = &dp->model->hooks;
    h->ctx = dp;
    h->forward_begin = zero3_forward_begin;
    h->block_forward_begin = zero3_block_forward_begin;
    h->block_forward_end = zero3_block_forward_end;
    h->backward_begin = zero3_backward_begin;
    h->block_backward_begin = zero3_block_backward_begin;
    h->block_backward_end = zero3_block_backward_end;
    h->backward_end = zero3_backward_end;
}

// Evaluation, sampling and checkpoints want the whole model: gather every bucket into a full
// table-ordered buffer and run without hooks until zero3_dematerialize frees it again.
static inline void zero3_materialize(DataParallel* dp) {
    if (dp->materialized) { return; }
    GPT2* m = dp->model;
    m->params_memory = (floatX*)dp_alloc(dp, MEM_COMM, m->num_parameters * sizeof(floatX));
    for (size_t b = 0; b < dp->buckets.size(); b++) {
        floatX* full = zero3_ensure(dp, (int)b);
        dp_copy_range(&dp->buckets[b], m->params_memory, full, 0, dp->buckets[b].count, 0);
        zero3_release(dp, (int)b);
    }
    point_parameters(&m->params, m->params_memory, m->param_info);
    m->hooks = GPT2Hooks{};
    dp->materialized = 1;
}
static inline void zero3_dematerialize(DataParallel* dp) {
    if (!dp->materialized) { return; }
    GPT2* m = dp->model;
    dp_free(dp, MEM_COMM, m->params_memory, m->num_parameters * sizeof(floatX));
    m->params_memory = NULL;
    point_parameters(&m->params, NULL, m->param_info);
    zero3_install_hooks(dp);
    dp->materialized = 0;
}

// --- after the update (ZeRO-1/2): every rank's updated block goes to everyone

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
