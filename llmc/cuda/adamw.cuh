// AdamW, the same math as llmc/cpu/adamw.h (bias-corrected moments, decoupled weight decay,
// grad_scale carrying the clipping factor), one thread per parameter (grid-stride).
// bf16 build: AdamW updates the fp32 master copy (master_params) and writes the parameter
// rounded to bf16 STOCHASTICALLY: up with probability (distance to the lower bf16 value) /
// (bf16 spacing), so that on average the rounding adds no bias and updates far smaller than
// the bf16 spacing still move the parameters. The random bits come from a hash of (seed, i):
// the same seed gives the same bits on every run (deterministic). fp32 build: master_params
// is NULL and the parameters are updated in place.
#pragma once

#include "common.cuh"

// a 32-bit integer hash (xorshift-multiply rounds), good enough to drive rounding
__device__ __forceinline__ unsigned int hash_u32(unsigned int x) {
    x ^= x >> 16; x *= 0x7feb352du;
    x ^= x >> 15; x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// fp32 -> bf16 stochastic rounding: add 16 random bits below the kept bits, then truncate.
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic_round(float x, unsigned int random) {
    unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) { return __float2bfloat16_rn(x); }   // NaN stays NaN (payload in the low bits)
    if ((bits & 0x7f800000u) != 0x7f800000u) {   // inf is kept as it is
        bits += random & 0xffffu;                // a carry into bit 16 rounds up
    }
    return __ushort_as_bfloat16((unsigned short)(bits >> 16));
}

__global__ void adamw_kernel(floatX* params, float* master_params, const floatX* grads, float* m, float* v, size_t n,
                             float lr, float beta1, float beta2, float bc1, float bc2, float eps, float weight_decay,
                             float grad_scale, unsigned int seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = to_float(grads[i]) * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float p = master_params ? master_params[i] : to_float(params[i]);
        p -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
        if (master_params) { master_params[i] = p; }
#ifdef ENABLE_FP32
        params[i] = p;
        (void)seed;
#else
        unsigned int random = hash_u32(hash_u32((unsigned int)i ^ seed) + (unsigned int)(i >> 32) + 0x9e3779b9u * seed);
        params[i] = bf16_stochastic_round(p, random);
#endif
    }
}

static inline void adamw_update(floatX* params, float* master_params, const floatX* grads, float* m, float* v,
                                size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                                int t, float grad_scale, unsigned int seed) {
    PROFILE_OP("adamw", OP_UPD, cost_adamw((double)n, master_params != NULL));
    float bc1 = 1.0f - powf(beta1, (float)t);   // on the host, exactly as the CPU computes them
    float bc2 = 1.0f - powf(beta2, (float)t);
    adamw_kernel<<<grid_for(n, 512), 512>>>(params, master_params, grads, m, v, n, lr, beta1, beta2, bc1, bc2, eps,
                                            weight_decay, grad_scale, seed);
    cudaCheckLaunch();
}
