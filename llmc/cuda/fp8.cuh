// FP8, simulated on any GPU (llmc/model/fp8_linear.h; llmc/cpu/fp8.h is the same on the CPU): the largest
// magnitude of a tensor, and fake quantisation out = round_fp8(in * scale) / scale, with the
// rounding of llmc/precision.h (plain fp32 bit manipulation, so it runs where the GPU has no
// FP8 units: every value an FP8 GEMM would read, then a bf16 GEMM with fp32 accumulation).
#pragma once

#include "common.cuh"
#include "../precision.h"

#define FP8_BLOCKS 256
#define FP8_THREADS 256

// per-block max |x| (and NaN flag as a NaN partial)
__global__ void fp8_absmax_kernel(float* partial, const floatX* x, size_t n) {
    __shared__ float shared[FP8_THREADS];
    float a = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = fabsf(to_float(x[i]));
        a = (v != v || a != a) ? NAN : fmaxf(a, v);
    }
    shared[threadIdx.x] = a;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float o = shared[threadIdx.x + s], m = shared[threadIdx.x];
            shared[threadIdx.x] = (o != o || m != m) ? NAN : fmaxf(m, o);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) { partial[blockIdx.x] = shared[0]; }
}

static inline float fp8_absmax(const floatX* x, size_t n) {
    static void* scratch = NULL;
    static size_t cap = 0;
    float* partial = (float*)scratch_reserve(&scratch, &cap, FP8_BLOCKS * sizeof(float));
    fp8_absmax_kernel<<<FP8_BLOCKS, FP8_THREADS>>>(partial, x, n);
    cudaCheckLaunch();
    float host[FP8_BLOCKS];
    cudaCheck(cudaMemcpy(host, partial, sizeof(host), cudaMemcpyDeviceToHost));
    float a = 0.0f;
    for (int i = 0; i < FP8_BLOCKS; i++) {
        if (host[i] != host[i]) { return NAN; }
        a = fmaxf(a, host[i]);
    }
    return a;
}

__global__ void fp8_quantize_kernel(floatX* out, const floatX* in, size_t n, float scale, int e5m2) {
    float inv = 1.0f / scale;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = to_float(in[i]) * scale;
        float q = e5m2 ? round_e5m2_sat(x) : round_e4m3(x);
        out[i] = from_float(q * inv);   // exact in bf16: 3 or 2 mantissa bits, a power-of-two scale
    }
}
static inline void fp8_quantize(floatX* out, const floatX* in, size_t n, float scale, int e5m2) {
    if (n == 0) { return; }
    fp8_quantize_kernel<<<grid_for(n, 512), 512>>>(out, in, n, scale, e5m2);
    cudaCheckLaunch();
}
