// AdamW (Loshchilov & Hutter), bias-corrected, decoupled weight decay. With g = grad * grad_scale
// (grad_scale carries the clipping factor) and t = 1, 2, ...:
//   m = b1 m + (1-b1) g          v = b2 v + (1-b2) g^2
//   mhat = m / (1 - b1^t)        vhat = v / (1 - b2^t)
//   p = p - lr * ( mhat / (sqrt(vhat) + eps) + weight_decay * p )
// The caller passes weight_decay = 0 for biases and layernorm parameters (decay on 2-D weights only).
// master_params and seed: the fp32 master copy of rounded parameters, and the seed of their
// stochastic rounding. With --precision fp32 there is no master (NULL) and the parameters are
// updated in place; with bf16 or fp16 (llmc/cpu/memory.h) AdamW updates the master and writes
// each parameter rounded from it: bf16 stochastically with the CUDA kernel's random bits
// (llmc/cuda/adamw.cuh), fp16 to nearest.
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format

#include "adamw_host.h"

static inline void adamw_update(float* params, float* master_params, const float* grads, float* m, float* v,
                         size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                         int t, float grad_scale, unsigned int seed) {
    PROFILE_OP("adamw", OP_UPD, cost_adamw((double)n, master_params != NULL));
    if (master_params == NULL) {
        adamw_host(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
        return;
    }
    adamw_host(master_params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
    int prec = cpu_prec.prec;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float p = master_params[i];
        params[i] = prec == PREC_BF16 ? round_bf16_stochastic(p, stochastic_bits(i, seed)) : round_to(prec, p);
    }
}
