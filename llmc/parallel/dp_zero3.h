// ZeRO-3 (Rajbhandari et al., 2020; PyTorch's FSDP): the parameters sharded too. Each rank keeps
// only its shard of every block's parameters, gradients and optimizer state, and holds a block's
// full parameters just for the moment it computes with them:
//
//   N = 4 ranks, block l's parameters in one bucket of P values (bucket_layout.h):
//     rank 0: | p0 |   rank 1: | p1 |   rank 2: | p2 |   rank 3: | p3 |      (p_r: P/4 values)
//   forward l    all-gather        -> | p0 p1 p2 p3 | on every rank -> forward l -> free
//   backward l   all-gather again  -> | p0 p1 p2 p3 | -> backward l -> gradients | g0 g1 g2 g3 |
//                reduce-scatter    -> rank r adds (sum over the ranks of their g_r) / N to its
//                                     gradient shard, as ZeRO-2 does -> free
//   update       rank r: AdamW on p_r alone (the next forward gathers the new values)
//
// Math: the gathered parameters are exactly one rank's, so the only arithmetic of data
// parallelism is the gradient's average (the reduce-scatter). Cost, per rank (N ranks, Psi
// parameters of a bytes, K bytes of optimizer state each; exact formulas: dp_accounting.h):
//   memory   (2a + K) Psi / N + what is gathered at the moment (the root, a block, the next
//            block's prefetch) and the gradient buckets in flight
//   bytes    per micro-step: all-gather every block twice and the root once, reduce-scatter
//            everything: ~3 (N-1)/N a Psi, against DDP's 2 (N-1)/N a Psi once per step
//
// One bucket per unit (transformer block, or the root: embeddings + final layernorm). Each
// gather of block l starts that of the next block to run (the prefetch); the root stays
// gathered from the start of the forward to the end of the backward (wte is both the first
// and the last layer):
//   forward:   AG root, AG 0 | fwd 0 (AG 1 starts) | fwd 1 (AG 2 starts) | ... | fwd 5 | head
//   backward:  AG 5 | bwd 5 (AG 4 starts), RS 5 | bwd 4 (AG 3 starts), RS 4 | ... | embed, RS root
// (AG = all-gather of a block's parameters, RS = reduce-scatter of its gradients; 6 blocks)
// Evaluation and checkpoints gather the full parameters once (zero3_materialize).
//
// ZeRO++ (dp_zeropp.h) is this mode with other collectives: its table (DP_MODE_ZEROPP) puts its
// own gather in dp->gather_params and its own reduce-scatter in bucket_ready.
#pragma once

#include "dp_zero.h"
#include "dp_accounting.h"

// --- parameters gathered just in time

// who asks for the gather: the forward, the backward, or evaluation and checkpoints (which
// always get the exact parameters, whatever gather ZeRO++ plugs in)
enum { ZERO3_FORWARD, ZERO3_BACKWARD, ZERO3_EXACT };

// on the communication thread: this rank's shard into its place in full, then the all-gather
static inline void zero3_allgather_shards(DataParallel* dp, const Bucket* bk, floatX* full) {
    // on the communicator's stream, like the all-gather that reads it (a copy on the compute
    // stream would not be ordered before it when the stream is non-blocking)
    comm_copy(dp->comm, full + (size_t)dp->rank * bk->shard, bk->param_shard, bk->shard, COMM_FLOATX);
    dp_allgather(dp, full, bk->padded);
}
// ZeRO-3's dp->gather_params: enqueue the all-gather of bucket b into full; returns its ticket
static inline long zero3_gather_params(DataParallel* dp, int b, int who, floatX* full) {
    (void)who;
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "all-gather params %d", b);
    return dp_enqueue(dp, name, [dp, bk, full] { zero3_allgather_shards(dp, bk, full); });
}

static inline void zero3_gather(DataParallel* dp, int b, int who) {   // start (no wait); no-op when alive
    Bucket* bk = &dp->buckets[b];
    if (bk->param_full != NULL) { return; }
    bk->param_full = dp_take(dp, MEM_COMM, bk->padded, 0);
    bk->gather_ticket = dp->gather_params(dp, b, who, bk->param_full);
}
static inline floatX* zero3_ensure(DataParallel* dp, int b, int who) {
    zero3_gather(dp, b, who);
    dp_wait(dp, dp->buckets[b].gather_ticket);
    return dp->buckets[b].param_full;
}
static inline void zero3_release(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    if (bk->param_full == NULL) { return; }
    dp_give(dp, MEM_COMM, bk->param_full, bk->padded);
    bk->param_full = NULL;
}

// --- the hooks (l: the global layer index; its unit and bucket are the stage's local ones)

static inline void zero3_forward_begin(void* ctx, ParameterTensors* root) {
    DataParallel* dp = (DataParallel*)ctx;
    if (dp->root_unit >= 0) { dp_root_pointers(dp, zero3_ensure(dp, dp->unit_bucket[dp->root_unit], ZERO3_FORWARD), root); }
    zero3_gather(dp, dp->unit_bucket[0], ZERO3_FORWARD);   // prefetch the first block
}
static inline void zero3_block_forward_begin(void* ctx, int l, BlockWeights* w) {
    DataParallel* dp = (DataParallel*)ctx;
    int u = dp_unit_of_layer(dp, l);
    dp_block_pointers(dp, u, zero3_ensure(dp, dp->unit_bucket[u], ZERO3_FORWARD), w);
    if (u + 1 < gpt2_local_layers(dp->model)) { zero3_gather(dp, dp->unit_bucket[u + 1], ZERO3_FORWARD); }   // prefetch
}
static inline void zero3_block_forward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    zero3_release(dp, dp->unit_bucket[dp_unit_of_layer(dp, l)]);
}
static inline void zero3_backward_begin(void* ctx, ParameterTensors* root, ParameterTensors* root_grads) {
    DataParallel* dp = (DataParallel*)ctx;
    if (dp->root_unit >= 0) {
        Bucket* rb = &dp->buckets[dp->unit_bucket[dp->root_unit]];
        dp_root_pointers(dp, zero3_ensure(dp, dp->unit_bucket[dp->root_unit], ZERO3_BACKWARD), root);
        rb->grad = dp_take_grad_bucket(dp, rb);
        dp_root_pointers(dp, rb->grad, root_grads);
    }
    int last = gpt2_local_layers(dp->model) - 1;
    zero3_gather(dp, dp->unit_bucket[last], ZERO3_BACKWARD);   // prefetch the last block
}
static inline void zero3_block_backward_begin(void* ctx, int l, BlockWeights* w, BlockWeights* grads) {
    DataParallel* dp = (DataParallel*)ctx;
    int u = dp_unit_of_layer(dp, l);
    int b = dp->unit_bucket[u];
    dp_block_pointers(dp, u, zero3_ensure(dp, b, ZERO3_BACKWARD), w);
    if (u > 0) { zero3_gather(dp, dp->unit_bucket[u - 1], ZERO3_BACKWARD); }   // prefetch
    dp->buckets[b].grad = dp_take_grad_bucket(dp, &dp->buckets[b]);
    dp_block_pointers(dp, u, dp->buckets[b].grad, grads);
}
// the gradients go with the mode's bucket_ready: ZeRO-2's reduce-scatter (dp_zero.h), handed
// to the communication thread
static inline void zero3_block_backward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    int b = dp->unit_bucket[dp_unit_of_layer(dp, l)];
    zero3_release(dp, b);
    dp->ops->bucket_ready(dp, b);
}
static inline void zero3_backward_end(void* ctx) {
    DataParallel* dp = (DataParallel*)ctx;
    if (dp->root_unit < 0) { return; }
    int b = dp->unit_bucket[dp->root_unit];
    dp->ops->bucket_ready(dp, b);
    zero3_release(dp, b);
}

static inline void zero3_init(DataParallel* dp) {
    buckets_init(dp, 3);
    gpt2_release_params(dp->model);   // only the shards remain
    dp->mem_live[MEM_PARAMS] -= dp->psi * sizeof(floatX);
    dp->gather_params = zero3_gather_params;
    GPT2Hooks h = {};
    h.forward_begin = zero3_forward_begin;
    h.block_forward_begin = zero3_block_forward_begin;
    h.block_forward_end = zero3_block_forward_end;
    h.backward_begin = zero3_backward_begin;
    h.block_backward_begin = zero3_block_backward_begin;
    h.block_backward_end = zero3_block_backward_end;
    h.backward_end = zero3_backward_end;
    dp_install_hooks(dp, "data parallel: ZeRO-3 gathers", h);
}

// --- the full model for evaluation, sampling and checkpoints: gather every bucket into a
// table-ordered buffer, and take this mode's hooks out of the chain (the passes then read the
// model's flat buffers) until zero3_dematerialize frees it and puts them back

static inline void zero3_materialize(DataParallel* dp) {
    if (dp->materialized) { return; }
    GPT2* m = dp->model;
    m->params_memory = (floatX*)dp_alloc(dp, MEM_COMM, m->num_parameters * sizeof(floatX));
    for (size_t b = 0; b < dp->buckets.size(); b++) {
        floatX* full = zero3_ensure(dp, (int)b, ZERO3_EXACT);
        dp_copy_range(&dp->buckets[b], m->params_memory, full, 0, dp->buckets[b].count, 0);
        zero3_release(dp, (int)b);
    }
    point_parameters(&m->params, m->params_memory, m->param_info);
    gpt2_remove_hooks(m, dp);
    dp->materialized = 1;
}
static inline void zero3_dematerialize(DataParallel* dp) {
    if (!dp->materialized) { return; }
    GPT2* m = dp->model;
    dp_free(dp, MEM_COMM, m->params_memory, m->num_parameters * sizeof(floatX));
    m->params_memory = NULL;
    point_parameters(&m->params, NULL, m->param_info);
    gpt2_add_hooks(m, &dp->hooks);
    dp->materialized = 0;
}

// the owners are disjoint; the parameters stay sharded (the gathers happen in the next forward)
static inline float zero3_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                                 float grad_clip) {
    return dp_update_owned(dp, lr, beta1, beta2, eps, weight_decay, grad_clip);
}

static const DPModeOps DP_MODE_ZERO3 = {
    "ZeRO-3", "ddp", 3,   // name, --dp-mode, --zero
    1, 0, "",             // reduce_every_micro, always_counted, comm_note
    zero3_init, buckets_zero_grad, zero3_update,
    zero2_reduce_scatter_bucket,   // (called by this mode's own hooks)
    zero3_materialize, zero3_dematerialize,
    zero3_formula_bytes, zero3_formula_memory,
    1,                    // owners_disjoint
};
