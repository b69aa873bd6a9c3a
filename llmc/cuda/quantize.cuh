// Block-wise symmetric quantisation on the GPU, for ZeRO++'s compressed collectives
// (llmc/parallel/dp_zeropp.h). The CPU twin, llmc/cpu/quantize.h, has the same names,
// signatures and wire format, and explains them:
//
//   wire:  | scale 0 | q 0 .. q 255 | scale 1 | q 256 .. q 511 | ...      (int32 words)
//   scale = absmax / qmax (qmax 127 or 7), q_i = round(x_i / scale), x'_i = q_i scale,
//   |x_i - x'_i| <= absmax / (2 qmax)
//
// quantize_blocks: one thread block per quantisation block, one thread per value: the block's
// absmax by a max over the warps, then each thread writes its code (int4: the even thread
// packs its own and its right neighbour's nibble into one byte). The dequantising kernels are
// elementwise. All run on the compute stream (the legacy default stream), like every kernel.
#pragma once

#include <stdint.h>
#include "common.cuh"

#include "../precision.h"   // QUANT_BLOCK and the wire layout's sizes (llmc/cpu/quantize.h explains them)

__device__ __forceinline__ int quant_code_at(const int32_t* blk, int i, int bits) {
    const uint8_t* codes = (const uint8_t*)(blk + 1);
    if (bits == 8) { return (int)(int8_t)codes[i]; }
    int nib = (codes[i / 2] >> (4 * (i & 1))) & 0xF;
    return (nib ^ 8) - 8;
}

__global__ void quantize_blocks_kernel(int32_t* wire, const floatX* x, size_t n, int bits, float* stats) {
    __shared__ float shared[32];
    const int qmax = (1 << (bits - 1)) - 1;
    const size_t bw = 1 + (size_t)QUANT_BLOCK * bits / 32;
    size_t lo = (size_t)blockIdx.x * QUANT_BLOCK;
    size_t i = lo + threadIdx.x;
    int cnt = n - lo < QUANT_BLOCK ? (int)(n - lo) : QUANT_BLOCK;
    float v = i < n ? to_float(x[i]) : 0.0f;
    int finite_v = isfinite(v);
    float amax = block_max(finite_v ? fabsf(v) : 0.0f, shared);
    float bad = block_max(finite_v ? 0.0f : 1.0f, shared);
    int finite = bad == 0.0f;
    float scale = finite ? amax / (float)qmax : __int_as_float(0x7fc00000);   // NaN
    float inv = finite && amax > 0.0f ? (float)qmax / amax : 0.0f;
    int q = (int)rintf(finite_v ? v * inv : 0.0f);
    q = q > qmax ? qmax : (q < -qmax ? -qmax : q);
    int32_t* blk = wire + blockIdx.x * bw;
    uint8_t* codes = (uint8_t*)(blk + 1);
    if (bits == 8) {
        codes[threadIdx.x] = (uint8_t)(int8_t)q;
    } else {
        int right = __shfl_down_sync(0xffffffffu, q, 1);
        if (threadIdx.x % 2 == 0) { codes[threadIdx.x / 2] = (uint8_t)((q & 0xF) | ((right & 0xF) << 4)); }
    }
    if (threadIdx.x == 0) {
        blk[0] = __float_as_int(scale);
        if (stats && finite) {
            atomicMax((int*)&stats[0], __float_as_int(amax));   // non-negative floats order as their bits
            atomicAdd(&stats[1], (float)cnt * (scale / 2) * (scale / 2));
            atomicAdd(&stats[2], (float)cnt * (scale / 2));
        }
    }
}

__global__ void dequantize_blocks_kernel(floatX* x, const int32_t* wire, size_t n, int bits) {
    const size_t bw = 1 + (size_t)QUANT_BLOCK * bits / 32;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int32_t* blk = wire + (i / QUANT_BLOCK) * bw;
        x[i] = from_float((float)quant_code_at(blk, (int)(i % QUANT_BLOCK), bits) * __int_as_float(blk[0]));
    }
}

__global__ void dequantize_accumulate_kernel(float* acc, const int32_t* wire, size_t n, int bits) {
    const size_t bw = 1 + (size_t)QUANT_BLOCK * bits / 32;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int32_t* blk = wire + (i / QUANT_BLOCK) * bw;
        acc[i] += (float)quant_code_at(blk, (int)(i % QUANT_BLOCK), bits) * __int_as_float(blk[0]);
    }
}

__global__ void quant_add_mean_kernel(floatX* dst, const float* acc, size_t n, int p) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = from_float(to_float(dst[i]) + acc[i] / (float)p);
    }
}

static inline void quantize_blocks(int32_t* wire, const floatX* x, size_t n, int bits, float* stats) {
    if (n == 0) { return; }
    quantize_blocks_kernel<<<(unsigned)quant_num_blocks(n), QUANT_BLOCK>>>(wire, x, n, bits, stats);
    cudaCheckLaunch();
}
static inline void dequantize_blocks(floatX* x, const int32_t* wire, size_t n, int bits) {
    if (n == 0) { return; }
    dequantize_blocks_kernel<<<grid_for(n, 256), 256>>>(x, wire, n, bits);
    cudaCheckLaunch();
}
static inline void dequantize_accumulate(float* acc, const int32_t* wire, size_t n, int bits) {
    if (n == 0) { return; }
    dequantize_accumulate_kernel<<<grid_for(n, 256), 256>>>(acc, wire, n, bits);
    cudaCheckLaunch();
}
static inline void quant_add_mean(floatX* dst, const float* acc, size_t n, int p) {
    if (n == 0) { return; }
    quant_add_mean_kernel<<<grid_for(n, 256), 256>>>(dst, acc, n, p);
    cudaCheckLaunch();
}
