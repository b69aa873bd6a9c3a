// The worker side of the asynchronous / stale synchronous parameter server
// (llmc/parallel/dp_ps_async.h), on every rank's main thread: push the gradient, pull the
// parameters the bound allows; the barrier that puts every worker at the same version.
#pragma once

#include "dp_ps_async_core.h"

static inline void psa_request(DataParallel* dp, int kind, int want, float lr, float beta1, float beta2, float eps,
                               float weight_decay, float grad_clip, float loss_scale) {
    PSAsync* a = dp->async;
    PSAMessage h = {kind, dp->rank, a->clock, a->version, want, a->loss_clock, a->loss, lr, beta1, beta2, eps,
                    weight_decay, grad_clip, loss_scale, 0};
    psa_send(a, &h, sizeof(h), 0, PSA_TAG_REQUEST, &dp->comm->bytes_sent, dp->rank);
    a->loss_clock = -1;
}
// the server's answer: the parameters of some version, into the model
static inline PSAReply psa_pull(DataParallel* dp) {
    PSAsync* a = dp->async;
    PSAReply r;
    psa_recv_poll(a, &r, sizeof(r), 0, PSA_TAG_REPLY, MPI_STATUS_IGNORE);
    psa_recv_dev(a, dp->model->params_memory, dp->psi, a->stage, 0, PSA_TAG_PARAMS);
    a->version = r.version;
    dp->model->step = r.step;
    return r;
}

// The mode's update: push the gradient, pull parameters of the version the bound allows
static inline float psa_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                               float grad_clip) {
    PSAsync* a = dp->async;
    double t0 = trace_now();
    int want = a->async ? 0 : a->clock + 1 - a->S;
    psa_request(dp, PSA_PUSH, want, lr, beta1, beta2, eps, weight_decay, grad_clip, dp->model->loss_scale);
    psa_send_dev(a, dp->model->grads_memory, dp->psi, a->stage, 0, PSA_TAG_GRAD, &dp->comm->bytes_sent, dp->rank);
    trace_event("push gradients", 0, t0);
    a->clock++;
    a->pushed_since_barrier = 1;
    double t1 = trace_now();
    PSAReply r = psa_pull(dp);
    trace_event(a->async ? "pull parameters" : "pull parameters (staleness bound)", 0, t1);
    double dt = trace_now() - t0;
    dp->comm_seconds += dt;
    dp->exposed_seconds += dt;   // the worker waits for it: nothing overlaps
    return r.norm;
}

// Every worker at the same version (evaluation, samples, checkpoints, the summary): each sends a
// barrier request; the server answers all of them once all N are in, so every worker then holds
// the same parameters, every update applied. Nothing to do when nothing was pushed since the last.
static inline void psa_barrier(DataParallel* dp) {
    PSAsync* a = dp->async;
    if (!a->pushed_since_barrier) { return; }
    psa_request(dp, PSA_BARRIER, -1, 0, 0, 0, 0, 0, 0, 1.0f);
    a->barriers_sent++;
    psa_pull(dp);
    a->pushed_since_barrier = 0;
}
