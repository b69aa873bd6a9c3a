// A data-parallel mode is a small table of functions (DPModeOps): what it allocates, what it
// does at the start of a step, when its collectives run, how it updates, and what the
// lecture's formulas predict for it. dp.h calls the trainer's entry points through the table
// of the mode the flags chose; there is no switch on the mode anywhere else.
//
//   table            file         collectives                            kept per rank
//   DP_MODE_NAIVE    dp_naive.h   one all-reduce after the backward      everything
//   DP_MODE_DDP      dp_ddp.h     an all-reduce per bucket, in backward  everything
//   DP_MODE_PS       dp_ps.h      push to the servers, pull back         servers: their slice's state
//   DP_MODE_ZERO1/2  dp_zero.h    a reduce-scatter per bucket, all-gather optimizer state (+ grads)
//   DP_MODE_ZERO3    dp_zero3.h   per block: all-gather, reduce-scatter  + parameters
// Where the optimizer state lives is a second, smaller table (DPOptimizerOps): on the device
// (DP_OPTIMIZER_DEVICE, below) or, with --offload, in host memory (offload.h).
//
// Also here, shared by every mode: the micro_begin hook (which micro-steps communicate), the
// optimizer state of the parameters a rank owns, and the update of what it owns (the gradient
// norm over the owners, clipping, AdamW segment by segment).
#pragma once

#include <algorithm>
#include "dp_core.h"

struct DPModeOps {
    const char* name;            // as the memory table prints it
    const char* flag;            // --dp-mode ...
    int zero;                    // ... with --zero ...
    int reduce_every_micro;      // 1: every micro-step communicates (no full gradient buffer to accumulate in)
    int always_counted;          // 1: its collectives are ours whatever --comm-algo says (bytes counted)
    const char* comm_note;       // appended to the "comm" line printed at start
    void (*init)(DataParallel* dp);        // buffers, optimizer state, segments, hooks
    void (*zero_grad)(DataParallel* dp);   // start of a step
    float (*update)(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                    float grad_clip);      // after the last backward; returns the norm before clipping
    void (*bucket_ready)(DataParallel* dp, int b);   // a bucket's gradients are complete (NULL: no buckets)
    void (*full_model_begin)(DataParallel* dp);      // evaluation, sampling, saving need every
    void (*full_model_end)(DataParallel* dp);        // parameter (NULL: they are always there)
    uint64_t (*formula_bytes)(const DataParallel* dp, int micro);       // sent per step (N > 1)
    void (*formula_memory)(const DataParallel* dp, size_t out[MEM_NCAT]);   // bytes per category
    int owners_disjoint;         // 1: each rank updates its own part (ZeRO, servers): the norm is summed over the
                                 // ranks, each rank saves its part (llmc/train/train_state.h); 0: every rank all of it
};
typedef struct DPModeOps DPModeOps;

struct DPOptimizerOps {
    const char* name;
    float* (*alloc)(DataParallel* dp, int cat, size_t n);   // zeroed state for n parameters, counted
    void (*seed_master)(float* master, const floatX* params, size_t n);   // fp32 master weights
    void (*prepare)(DataParallel* dp);   // once the segments are known (NULL: nothing to do)
    void (*adamw)(DataParallel* dp, const OptSegment* s, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t, float grad_scale, unsigned int seed);
    void (*release)(float* p);
};
typedef struct DPOptimizerOps DPOptimizerOps;

static inline int dp_has_master(const DataParallel* dp) { return BACKEND_MASTER_WEIGHTS || dp->offload; }

// ---------------------------------------------------------------------------------------
// The optimizer on the device (the default): state in device memory, the backend's AdamW.

static inline float* dp_device_state(DataParallel* dp, int cat, size_t n) {
    float* p = (float*)dp_alloc(dp, cat, n * sizeof(float));
    device_memset_zero(p, n * sizeof(float));
    return p;
}
static inline void dp_device_seed_master(float* master, const floatX* params, size_t n) {
    convert_floatX_to_float(master, params, n);
}
static inline void dp_device_adamw(DataParallel* dp, const OptSegment* s, float lr, float beta1, float beta2, float eps,
                                   float weight_decay, int t, float grad_scale, unsigned int seed) {
    (void)dp;
    adamw_update(s->param, s->master, s->grad, s->m, s->v, s->n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                 seed);
}
static inline void dp_device_release(float* p) { device_free(p); }

static const DPOptimizerOps DP_OPTIMIZER_DEVICE = {
    "device", dp_device_state, dp_device_seed_master, NULL, dp_device_adamw, dp_device_release,
};

// ---------------------------------------------------------------------------------------
// The hooks every mode installs. micro_begin: only the last micro-step's backward
// communicates (the earlier ones accumulate, like DDP's no_sync()), except in the modes that
// have no full gradient buffer to accumulate in (ZeRO-2/3): they reduce every micro-step.

static inline void dp_micro_begin(void* ctx, int i, int n) {
    DataParallel* dp = (DataParallel*)ctx;
    dp->sync = i == n - 1 || dp->ops->reduce_every_micro;
}

// A mode's table of hooks joins the model's chain (llmc/model/gpt2.h); dp->hooks keeps a copy so
// that ZeRO-3 can take it out and put it back.
static inline void dp_install_hooks(DataParallel* dp, const char* name, GPT2Hooks h) {
    h.name = name;
    h.ctx = dp;
    h.micro_begin = dp_micro_begin;
    dp->hooks = h;
    gpt2_add_hooks(dp->model, &dp->hooks);
}

// ---------------------------------------------------------------------------------------
// Owning a contiguous range [o, o + n) of the model's flat buffers (naive DP: all of it; a
// parameter server: its slice): optimizer state for the range, and segments that cut it at
// tensor boundaries.
static inline void dp_own_flat_range(DataParallel* dp, size_t o, size_t n) {
    GPT2* model = dp->model;
    dp->own_flat_offset = o;
    dp->own_flat_count = n;
    dp->flat_m = dp->opt->alloc(dp, MEM_OPTIM, n);
    dp->flat_v = dp->opt->alloc(dp, MEM_OPTIM, n);
    if (dp_has_master(dp)) {
        dp->flat_master = dp->opt->alloc(dp, MEM_MASTER, n);
        dp->opt->seed_master(dp->flat_master, model->params_memory + o, n);
    }
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
        size_t s = std::max(o, p->offset), e = std::min(o + n, p->offset + p->numel);
        if (s >= e) { continue; }
        dp->segments.push_back({i, model->params_memory + s, model->grads_memory + s, dp->flat_m + (s - o),
                                 dp->flat_v + (s - o), dp->flat_master ? dp->flat_master + (s - o) : NULL, e - s, s});
    }
}

// ---------------------------------------------------------------------------------------
// The update of what this rank owns (its OptSegments), after its gradients are complete.

// squared norm of what this rank owns; when the owners are disjoint (ZeRO, parameter server)
// the parts are summed over the ranks (8 bytes, not counted), else every rank has it all. With
// tensor and pipeline parallelism the shards of the replica are summed too (dp->shards), a
// replicated tensor counted on tp rank 0 only and the tied wte on the first stage only.
// Whether this rank's copy of a tensor is the one that counts (in the norm, in the training
// state): a tensor every tp rank holds whole counts on tp rank 0 only, and the last pipeline
// stage's copy of the tied wte (the LM head) is counted by the first stage.
static inline int dp_segment_counted(const GPT2* m, int tensor) {
    if (m->place.tp_rank != 0 && m->param_info[tensor].shard == SHARD_REPLICATED) { return 0; }
    if (m->param_info[tensor].used_by == (USE_EMBEDDING | USE_HEAD) && !m->place.has_embedding) { return 0; }
    return 1;
}
static inline double dp_segments_norm_squared(GPT2* m, const std::vector<OptSegment>& segments) {
    double sq = 0.0;
    for (const OptSegment& s : segments) {
        if (!dp_segment_counted(m, s.tensor)) { continue; }
        float part;
        global_norm_squared(m->norm_squared, s.grad, s.n);
        copy_device_to_host(&part, m->norm_squared, sizeof(float));
        sq += part;
    }
    return sq;
}
static inline float dp_grad_norm(DataParallel* dp) {
    GPT2* m = dp->model;
    double sq = dp_segments_norm_squared(m, dp->segments);
    if (dp->ops->owners_disjoint) { MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, dp->comm->mpi); }
    if (dp->experts.reduce) { sq += dp->experts.sum_norm(dp->experts.ctx, dp_segments_norm_squared(m, dp->experts.segments)); }
    if (dp->shards.sum_norm) { sq = dp->shards.sum_norm(dp->shards.ctx, sq); }
    return (float)sqrt(sq);
}

// Wait for every gradient collective, clip, AdamW on each segment (the same seed per tensor
// and step as one rank's gpt2_update). Returns the norm before clipping.
static inline float dp_update_owned(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                                    float grad_clip) {
    GPT2* m = dp->model;
    dp_wait_all(dp);   // every bucket's collective has finished
    dp->in_flight.clear();
    double t0 = trace_now();
    if (dp->shards.complete_grads) {
        for (const OptSegment& s : dp->segments) { dp->shards.complete_grads(dp->shards.ctx, s.tensor, s.grad, s.n); }
    }
    if (dp->experts.reduce) { dp->experts.reduce(dp->experts.ctx); }   // expert parallelism's own group
    float norm = dp_grad_norm(dp) / m->loss_scale;   // the same on every rank: all skip or none (unscaled: llmc/train/loss_scale.h)
    if (!isfinite(norm) && m->skip_nonfinite) { trace_event("AdamW update (skipped)", 0, t0); return norm; }
    float grad_scale = ((grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f) / m->loss_scale;
    m->step += 1;
    for (const OptSegment& s : dp->segments) {
        float wd = m->param_info[s.tensor].decay ? weight_decay : 0.0f;
        dp->opt->adamw(dp, &s, lr, beta1, beta2, eps, wd, m->step, grad_scale,
                       (unsigned int)(m->step * 1000003u + s.tensor));
    }
    for (const OptSegment& s : dp->experts.segments) {   // on the device, whatever --offload says
        float wd = m->param_info[s.tensor].decay ? weight_decay : 0.0f;
        adamw_update(s.param, s.master, s.grad, s.m, s.v, s.n, lr, beta1, beta2, eps, wd, m->step, grad_scale,
                     (unsigned int)(m->step * 1000003u + s.tensor));
    }
    trace_event("AdamW update", 0, t0);
    return norm;
}

// ---------------------------------------------------------------------------------------
// The memory formula's rows: parameters and gradients as the mode says, the optimizer state
// (K bytes per owned parameter: m, v and the master weights where there are any) on the device
// unless offloaded, the activations as the model allocated them.
static inline void dp_formula_rows(const DataParallel* dp, size_t out[MEM_NCAT], size_t params, size_t grads,
                                   size_t owned) {
    memset(out, 0, MEM_NCAT * sizeof(size_t));
    size_t on_device = dp->offload ? 0 : 1;
    out[MEM_PARAMS] = params;
    out[MEM_GRADS] = grads;
    out[MEM_MASTER] = dp_has_master(dp) ? on_device * 4 * owned : 0;
    out[MEM_OPTIM] = on_device * 8 * owned;
    out[MEM_ACTS] = dp->model->acts_bytes;
}
