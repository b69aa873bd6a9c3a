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
#pragma once

#include <math.h>
#include <stdlib.h>
#include "dp_core.h"

static inline float* host_floats(size_t n) {
    float* p = (float*)calloc(n ? n : 1, sizeof(float));
    if (!p) { die("--offload: out of host memory for %zu floats", n); }
    return p;
}

// One contiguous run of this rank's parameters: gradients come from the device, the update
// runs on the host copy (master, m, v), the result goes back to the device parameters.
// The math is llmc/cpu/adamw.h's.
static inline void offload_adamw(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                                 float* scratch, float lr, float beta1, float beta2, float eps, float weight_decay,
                                 int t, float grad_scale) {
    copy_floats_to_host(scratch, grads, n);   // device -> host (PCIe on a GPU)
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = scratch[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        master[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * master[i]);
    }
    copy_floats_to_device(params, master, n);   // host -> device
}
