// ZeRO-Offload (Ren et al., 2021): the optimizer lives in host memory.
// With --offload (on ZeRO-1 or ZeRO-2) this rank's block of the fp32 master weights and of
// AdamW's m and v is kept in host RAM (about 1 TB on a node against 80 GB of HBM), and the
// update runs on the CPU:
//   1. forward and backward on the GPU, gradients reduce-scattered as in ZeRO-2
//   2. this rank's gradient block: GPU -> CPU          (a Psi/N bytes over PCIe)
//   3. AdamW on the CPU, on the fp32 master weights    (memory-bound: slower than on the GPU)
//   4. the updated parameters, rounded to floatX: CPU -> GPU   (a Psi/N bytes), then all-gather
// GPU memory per rank drops to 2a Psi (ZeRO-1) or a Psi + a Psi/N (ZeRO-2); the price is the
// PCIe traffic and the CPU update time, which the step time shows.
// On the CPU backend "device" memory is host memory, so the copies are plain memcpy: the run
// exercises the same code path (and must give the same numbers) but saves nothing.
//
// The modes are ZeRO-1/2's own (dp_zero.h); what changes is their optimizer table: this file's
// DP_OPTIMIZER_HOST in place of DP_OPTIMIZER_DEVICE (dp_mode.h).
#pragma once

#include <math.h>
#include <stdlib.h>
#include "../cpu/adamw_host.h"
#include "dp_mode.h"

static inline float* host_floats(size_t n) {
    float* p = (float*)calloc(n ? n : 1, sizeof(float));
    if (!p) { die("--offload: out of host memory for %zu floats", n); }
    return p;
}

// One contiguous run of this rank's parameters: gradients come from the device, the update
// runs on the host copy (master, m, v) with the CPU backend's AdamW loop, the result goes back
// to the device parameters.
static inline void offload_adamw(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                                 float* scratch, float lr, float beta1, float beta2, float eps, float weight_decay,
                                 int t, float grad_scale) {
    copy_floats_to_host(scratch, grads, n);   // device -> host (PCIe on a GPU)
    adamw_host(master, scratch, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
    copy_floats_to_device(params, master, n);   // host -> device
}

// --- the optimizer table: state in host memory (counted in host_live, not in the device
// categories), master weights always (the host AdamW runs in fp32), one scratch buffer for the
// gradients of the largest segment

static inline float* offload_state(DataParallel* dp, int cat, size_t n) {
    (void)cat;
    dp->host_live += n * sizeof(float);
    return host_floats(n);
}
static inline void offload_seed_master(float* master, const floatX* params, size_t n) {
    copy_floats_to_host(master, params, n);
}
static inline void offload_prepare(DataParallel* dp) {
    size_t most = 0;
    for (const OptSegment& s : dp->segments) { most = std::max(most, s.n); }
    dp->offload_scratch = host_floats(most);
}
static inline void offload_segment_adamw(DataParallel* dp, const OptSegment* s, float lr, float beta1, float beta2,
                                         float eps, float weight_decay, int t, float grad_scale, unsigned int seed) {
    (void)seed;   // adamw_host draws no random bits: it takes no seed
    offload_adamw(s->param, s->master, s->grad, s->m, s->v, s->n, dp->offload_scratch, lr, beta1, beta2, eps,
                  weight_decay, t, grad_scale);
}
static inline void offload_release(float* p) { free(p); }

static const DPOptimizerOps DP_OPTIMIZER_HOST = {
    "host (ZeRO-Offload)", offload_state, offload_seed_master, offload_prepare, offload_segment_adamw, offload_release,
};
