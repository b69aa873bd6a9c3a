// The expert gradients of expert parallelism (llmc/parallel/ep.h), and its setup (ep_init).
// Included at the end of ep.h.
//
// A dense weight's gradient is averaged over dp as before. An expert's weights live on dp/ep
// ranks (its edp group), and its gradient on each of them already sums over the tokens of a
// whole ep group: the mean over the global batch is the average over edp divided by ep.
// Averaging over all dp ranks instead would mix different experts' gradients (doc/expert-parallel.md
// shows the equivalence test failing). Data parallelism (llmc/parallel/dp.h) leaves the expert
// tensors out of its buckets (skip_experts); ep keeps their gradients in a buffer of its own (a
// placement hook points the passes at it), reduces them over edp before the update and hands
// their segments to dp's update (ExpertOwners), so one clip covers the model.
#pragma once

#include "ep_core.h"   // ExpertParallel, ep_comm_ready

// the block's expert tensors' gradients: ep's buffer, laid out as in the flat buffer
static inline void ep_block_backward_begin(void* ctx, int l, BlockWeights* w, BlockWeights* g) {
    (void)w;
    ExpertParallel* ep = (ExpertParallel*)ctx;
    GPT2* m = ep->model;
    if (!gpt2_layer_is_moe(&m->config, l)) { return; }
    // the block's slices, laid out as in the flat buffer, shifted to ep's buffer
    BlockWeights flat = block_weights_in(m->params_memory, m->param_info, &m->place, l);
    for (int i = FIRST_EXPERT_TENSOR; i < NUM_PARAMETER_TENSORS; i++) {
        int k = table_block_tensor(i);
        *block_tensor(g, k) = ep->grads + (*block_tensor(&flat, k) - (m->params_memory + ep->offset));
    }
}

// dp's update asks (dp_core.h's ExpertOwners): average over the replicas of the same experts,
// divided by ep (the gradient already sums over the ep group's tokens); the squared norm of the
// experts summed over the ep group (each rank's are different ones)
static inline void ep_reduce(void* ctx) {
    ExpertParallel* ep = (ExpertParallel*)ctx;
    Comm* group = &ep->edp;   // the replicas of this rank's experts (all dp ranks would mix different experts)
    if (group->size > 1) {
        ep_comm_ready(ep, group);
        if (ep->use_ring) { allreduce_ring(group, ep->grads, ep->grads, ep->count, COMM_FLOATX, COMM_AVG); }
        else { allreduce_native(group, ep->grads, ep->grads, ep->count, COMM_FLOATX, COMM_AVG); }
    }
    moe_scale(ep->grads, ep->count, (float)group->size / ep->dp);   // the average over edp, divided by ep
}
static inline double ep_sum_norm(void* ctx, double sq) {
    MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, ((ExpertParallel*)ctx)->comm.mpi);   // 8 bytes, not counted
    return sq;
}

// Collective over the data-parallel group `dp_comm`, after dp_init: the ep and edp groups, the
// mlp op, the expert gradients and their optimizer state.
static inline void ep_init(ExpertParallel* ep, GPT2* model, Comm* dp_comm, DataParallel* dp, int use_ring) {
    memset((void*)ep, 0, sizeof(*ep));
    int n = model->place.ep, r = dp_comm->rank;
    if (dp_comm->size % n != 0) {
        die("--ep %d does not divide the %d data-parallel ranks: the ep groups are formed from them", n, dp_comm->size);
    }
    ep->model = model;
    ep->ep = n;
    ep->dp = dp_comm->size;
    ep->use_ring = use_ring;
    ep->dp_comm = dp_comm;
    ep->comm = comm_split(dp_comm, r / n, r % n, "ep");
    ep->edp = comm_split(dp_comm, r % n, r / n, "edp");
    ep->rank = ep->comm.rank;
    if (ep->rank != model->place.ep_rank) { die("expert parallelism: ep rank %d, but the model holds ep shard %d", ep->rank, model->place.ep_rank); }
#ifdef LLMC_CUDA_COMM
    comm_enable_device(&ep->comm, 0, 0);   // device rows, on the compute thread (a blocking stream, as tp's)
    comm_enable_device(&ep->edp, 0, 0);
#endif
    ep->ready = backend_event_create();
    ep->xch = MoEExchange{ep, n, ep->rank, ep_experts_forward, ep_experts_backward};
    model->ops.mlp.ctx = ep;
    model->ops.mlp.forward = ep_mlp_forward;
    model->ops.mlp.backward = ep_mlp_backward;
    // the expert tensors (the last of the table) and their state
    ep->offset = model->param_info[FIRST_EXPERT_TENSOR].offset;
    ep->count = model->num_parameters - ep->offset;
    ep->grads = (floatX*)device_malloc(ep->count * sizeof(floatX));
    device_memset_zero(ep->grads, ep->count * sizeof(floatX));
    ep->m = (float*)device_malloc(ep->count * sizeof(float));
    ep->v = (float*)device_malloc(ep->count * sizeof(float));
    device_memset_zero(ep->m, ep->count * sizeof(float));
    device_memset_zero(ep->v, ep->count * sizeof(float));
    ep->bytes_state = ep->count * (sizeof(floatX) + 8);
    if (BACKEND_MASTER_WEIGHTS) {
        ep->master = (float*)device_malloc(ep->count * sizeof(float));
        convert_floatX_to_float(ep->master, model->params_memory + ep->offset, ep->count);
        ep->bytes_state += ep->count * 4;
    }
    dp->experts.ctx = ep;
    dp->experts.reduce = ep_reduce;
    dp->experts.sum_norm = ep_sum_norm;
    for (int i = FIRST_EXPERT_TENSOR; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
        size_t o = p->offset - ep->offset;
        dp->experts.segments.push_back({i, model->params_memory + p->offset, ep->grads + o, ep->m + o, ep->v + o,
                                        ep->master ? ep->master + o : NULL, p->numel, p->offset});
    }
    ep->hooks = GPT2Hooks{};
    ep->hooks.name = "expert parallel: expert gradients";
    ep->hooks.ctx = ep;
    ep->hooks.block_backward_begin = ep_block_backward_begin;
    gpt2_add_hooks(model, &ep->hooks);
}

static inline void ep_zero_grad(ExpertParallel* ep) { device_memset_zero(ep->grads, ep->count * sizeof(floatX)); }

// before a step: its statistics from zero
static inline void ep_step_begin(ExpertParallel* ep) {
    ep->step_start = ep->comm.bytes_sent;
    ep->edp_start = ep->edp.bytes_sent;
    ep->seconds = 0.0;
}

static inline void ep_free(ExpertParallel* ep) {
    backend_event_destroy(ep->ready);
    device_free(ep->grads);
    device_free(ep->m);
    device_free(ep->v);
    if (ep->master) { device_free(ep->master); }
    comm_free(&ep->comm);
    comm_free(&ep->edp);
}
