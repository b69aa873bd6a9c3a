// The update of what a rank owns, the same for every data-parallel mode: once its gradients
// are complete, the gradient norm over the whole model, clipping, and AdamW on each run of
// parameters it owns (its OptSegments: the whole model, a server's slice, or a ZeRO shard).
//
//   norm^2 = sum over the ranks that own disjoint parts (ZeRO, servers) of their squared norms
//   scale  = min(1, clip / norm): one factor for the whole model, so every rank clips alike
//   AdamW  on each owned segment, the same seed per tensor and step as one rank's gpt2_update
#pragma once

#include <math.h>
#include <vector>
#include "dp_core.h"

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
// the norm of the whole model's gradient: this rank's part, summed over the ranks when the owners
// are disjoint (ZeRO, parameter server; 8 bytes, not counted), else every rank has it all; with
// tensor and pipeline parallelism summed over the other shards of the replica too (dp->shards)
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
