// ZeRO-3 (FSDP): the parameters sharded too (dp_zero.h has the table of the three stages):
//   memory per rank   (2a + K) Psi_pad/N + the blocks gathered at the moment
//   traffic per step  per micro-step: all-gather every block twice (forward, backward) and the
//                     root once, reduce-scatter all gradients: about 3 (N-1)/N a Psi
//
// One bucket per unit (transformer block, or the root: embeddings + final layernorm), and only
// the parameter shards persist. Before block l's forward its parameters are all-gathered (the
// gather of block l+1 is started at the same time: the prefetch), after it they are freed; the
// backward gathers them again (prefetching l-1), computes the block's gradients into a
// temporary bucket, frees the parameters, and reduce-scatters the gradients into the shard
// (as ZeRO-2). The root unit stays gathered from the start of the forward to the end of the
// backward (wte is both the first and the last layer).
//
//   forward:   AG root, AG 0 | fwd 0 (AG 1 starts) | fwd 1 (AG 2 starts) | ... | fwd 5 | head
//   backward:  AG 5 | bwd 5 (AG 4 starts), RS 5 | bwd 4 (AG 3 starts), RS 4 | ... | embed, RS root
// (AG = all-gather of a block's parameters, RS = reduce-scatter of its gradients; 6 blocks)
//
// Evaluation and checkpoints gather the full parameters once (zero3_materialize) and run
// without this mode's hooks until zero3_dematerialize.
//
// ZeRO++ (--qwz, --hpz, --qgz: dp_zeropp.h) changes three of these collectives: the gathers
// (quantised, or the backward's from a secondary copy within a group of ranks) and the
// reduce-scatter (quantised, over an all-to-all). Evaluation and checkpoints still gather exactly.
#pragma once

#include "dp_zero.h"
#include "dp_zeropp.h"

// --- parameters gathered just in time

// who asks for the gather: the forward, the backward (ZeRO++ gathers these two its own way), or
// evaluation and checkpoints (always the exact parameters)
enum { ZERO3_FORWARD, ZERO3_BACKWARD, ZERO3_EXACT };

static inline void zero3_gather(DataParallel* dp, int b, int who) {   // start (no wait); no-op when alive
    Bucket* bk = &dp->buckets[b];
    if (bk->param_full != NULL) { return; }
    bk->param_full = dp_take(dp, MEM_COMM, bk->padded, 0);
    floatX* full = bk->param_full;
    ZeroPP* z = who == ZERO3_EXACT ? NULL : zeropp_of(dp);
    int block = b != zeropp_root_bucket(dp);
    int from_secondary = z && z->hpz && block && who == ZERO3_BACKWARD;   // hpZ: within the group
    int quantized = z && z->qwz && !from_secondary;                       // qwZ: int8 over all ranks
    int keep_secondary = z && z->hpz && block && who == ZERO3_FORWARD;
    char name[64];
    snprintf(name, sizeof(name), "all-gather params %d%s", b, from_secondary ? " (hpZ group)" : quantized ? " (int8)" : "");
    bk->gather_ticket = dp_enqueue(dp, name, [dp, bk, full, z, b, who, from_secondary, quantized, keep_secondary] {
        if (from_secondary) {
            zeropp_gather_secondary(z, b, full);
        } else if (quantized) {
            zeropp_gather_quantized(z, bk, full, who == ZERO3_FORWARD);
        } else {
            // on the communicator's stream, like the all-gather that reads it (a copy on the compute
            // stream would not be ordered before it when the stream is non-blocking)
            comm_copy(dp->comm, full + (size_t)dp->rank * bk->shard, bk->param_shard, bk->shard, COMM_FLOATX);
            dp_allgather(dp, full, bk->padded);
        }
        if (keep_secondary) { zeropp_keep_secondary(z, b, full); }
    });
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
// the gradients: ZeRO-2's reduce-scatter, or with --qgz ZeRO++'s quantised one (dp_zeropp.h),
// handed to the communication thread the same way
static inline void zero3_reduce_scatter_bucket(DataParallel* dp, int b) {
    ZeroPP* z = zeropp_of(dp);
    if (!z || !z->qgz) { zero2_reduce_scatter_bucket(dp, b); return; }
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "reduce-scatter bucket %d (int%d all-to-all)", b, z->qgz);
    floatX* buf = bk->grad;
    bk->grad = NULL;
    bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk, buf, z] {
        zeropp_reduce_scatter(z, bk, buf);
        dp_give(dp, MEM_GRADS, buf, bk->padded);
    });
    dp->in_flight.push_back(bk->reduce_ticket);
}

static inline void zero3_block_backward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    int b = dp->unit_bucket[dp_unit_of_layer(dp, l)];
    zero3_release(dp, b);
    zero3_reduce_scatter_bucket(dp, b);
}
static inline void zero3_backward_end(void* ctx) {
    DataParallel* dp = (DataParallel*)ctx;
    if (dp->root_unit < 0) { return; }
    int b = dp->unit_bucket[dp->root_unit];
    zero3_reduce_scatter_bucket(dp, b);
    zero3_release(dp, b);
}

static inline void zero3_init(DataParallel* dp) {
    buckets_init(dp, 3);
    gpt2_release_params(dp->model);   // only the shards remain
    dp->mem_live[MEM_PARAMS] -= dp->psi * sizeof(floatX);
    GPT2Hooks h = {};
    h.forward_begin = zero3_forward_begin;
    h.block_forward_begin = zero3_block_forward_begin;
    h.block_forward_end = zero3_block_forward_end;
    h.backward_begin = zero3_backward_begin;
    h.block_backward_begin = zero3_block_backward_begin;
    h.block_backward_end = zero3_block_backward_end;
    h.backward_end = zero3_backward_end;
    dp_install_hooks(dp, "data parallel: ZeRO-3 gathers", h);
    zeropp_alloc(dp);   // ZeRO++'s secondary copies and wire buffers (nothing without its flags)
}
static inline void zero3_zero_grad(DataParallel* dp) {
    buckets_zero_grad(dp);
    zeropp_zero_grad(dp);
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

// --- what the lecture predicts

// per micro-step: all-gather of every block twice (forward, backward) and of the root once,
// reduce-scatter of everything (ZeRO++: its formula, dp_zeropp.h; the hpZ group's bytes included)
static inline uint64_t zero3_formula_bytes(const DataParallel* dp, int micro) {
    const ZeroPP* z = zeropp_of(dp);
    if (z) {
        uint64_t per[ZPP_NCOLL];
        return (uint64_t)micro * zeropp_formula(dp, z, per);
    }
    int N = dp->N;
    size_t a = sizeof(floatX);
    size_t root = dp->root_unit >= 0 ? dp->buckets[dp->unit_bucket[dp->root_unit]].padded : 0;
    uint64_t blocks = (uint64_t)(N - 1) * ((dp->psi_pad - root) / N) * a;
    uint64_t rootb = (uint64_t)(N - 1) * (root / N) * a;
    return (uint64_t)micro * (2 * blocks + rootb + buckets_ring_share(dp));
}
// hpZ adds its secondary copy to the parameters: a / hpz of every block's padded bucket
static inline void zero3_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    const ZeroPP* z = zeropp_of(dp);
    size_t secondary = 0;
    if (z && z->hpz) {
        size_t root = dp->root_unit >= 0 ? dp->buckets[dp->unit_bucket[dp->root_unit]].padded : 0;
        secondary = a * (dp->psi_pad - root) / z->hpz;   // every block's padded size is a multiple of N, so of hpz
    }
    dp_formula_rows(dp, out, a * dp->psi_pad / dp->N + secondary, a * dp->psi_pad / dp->N, dp->psi_pad / dp->N);
}

static const DPModeOps DP_MODE_ZERO3 = {
    "ZeRO-3", "ddp", 3,   // name, --dp-mode, --zero
    1, 0, "",             // reduce_every_micro, always_counted, comm_note
    zero3_init, zero3_zero_grad, zero3_update,
    zero3_reduce_scatter_bucket,   // (called by this mode's own hooks)
    zero3_materialize, zero3_dematerialize,
    zero3_formula_bytes, zero3_formula_memory,
    1,                    // owners_disjoint
};
