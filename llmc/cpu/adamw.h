// AdamW (Loshchilov & Hutter), bias-corrected, decoupled weight decay. With g = grad * grad_scale
// (grad_scale carries the clipping factor) and t = 1, 2, ...:
//   m = b1 m + (1-b1) g          v = b2 v + (1-b2) g^2
//   mhat = m / (1 - b1^t)        vhat = v / (1 - b2^t)
//   p = p - lr * ( mhat / (sqrt(vhat) + eps) + weight_decay * p )
// The caller passes weight_decay = 0 for biases and layernorm parameters (decay on 2-D weights only).
// master_params and seed exist for the CUDA backend (fp32 master copy of bf16 parameters,
// stochastic rounding); on the CPU parameters are fp32 already and both are unused.
#pragma once

#include "adamw_host.h"

static inline void adamw_update(float* params, float* master_params, const float* grads, float* m, float* v,
                         size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                         int t, float grad_scale, unsigned int seed) {
    (void)master_params;
    (void)seed;
    adamw_host(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
}
