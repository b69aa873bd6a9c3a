// The AdamW loop on fp32 host arrays (the math is in adamw.h's header). A file and a name of
// its own so that ZeRO-Offload (llmc/parallel/offload.h) runs the same loop in the CUDA build,
// where adamw_update is the GPU kernel's. Vectorised: __restrict__ arrays, -fno-math-errno (sqrtf).
#pragma once

#include <math.h>

static inline void adamw_host(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ m,
                              float* __restrict__ v, size_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int t, float grad_scale) {
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
    }
}
