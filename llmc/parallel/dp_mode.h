// A data-parallel mode is a small table of functions (DPModeOps, dp_core.h): what it allocates,
// what it does at the start of a step, when its collectives run, how it updates, and what the
// lecture's formulas predict for it. dp.h calls the trainer's entry points through the table
// of the mode the flags chose; there is no switch on the mode anywhere else.
//
//   table            file         collectives                            kept per rank
//   DP_MODE_NAIVE    dp_naive.h   one all-reduce after the backward      everything
//   DP_MODE_DDP      dp_ddp.h     an all-reduce per bucket, in backward  everything
//   DP_MODE_PS       dp_ps.h      push to the servers, pull back         servers: their slice's state
//   DP_MODE_ZERO1/2  dp_zero.h    a reduce-scatter per bucket, all-gather optimizer state (+ grads)
//   DP_MODE_ZERO3    dp_zero3.h   per block: all-gather, reduce-scatter  + parameters
//   DP_MODE_ZEROPP   dp_zeropp.h  ZeRO-3's, quantised or within a group  + hpZ's secondary copy
// Where the optimizer state lives is a second, smaller table (DPOptimizerOps): on the device
// (DP_OPTIMIZER_DEVICE, below) or, with --offload, in host memory (offload.h).
//
// Also here, shared by every mode: the micro_begin hook (which micro-steps communicate) and the
// optimizer state of the parameters a rank owns. Every mode's file includes this one, and with
// it the update of what a rank owns (dp_update.h) and the rows of the memory formula
// (dp_accounting.h).
#pragma once

#include <algorithm>
#include "dp_core.h"
#include "dp_update.h"
#include "dp_accounting.h"

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
