// Shared pieces of the CUDA backend: the floatX type, error checks, bf16 <-> fp32 helpers,
// warp/block reductions, and the deterministic "sum partials in a fixed order" helper.
//
// Precision: floatX is __nv_bfloat16 by default (parameters, gradients, activations), float
// when built with -DENABLE_FP32 (make PRECISION=FP32: a debugging build held to the CPU's
// tolerances). Everything that is summed (reductions, softmax, layernorm statistics, the loss,
// AdamW) is computed in fp32 whatever floatX is.
//
// Streams: every kernel runs on the legacy default stream, so the order of the launches is
// the order of the calls and cudaMemcpy (synchronous) sees every earlier kernel's results.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "../common.h"

#ifdef ENABLE_FP32
typedef float floatX;
#define FLOATX_IS_BF16 0
#else
typedef __nv_bfloat16 floatX;
#define FLOATX_IS_BF16 1
#endif

// Every CUDA runtime call goes through cudaCheck: on failure it names the call site and the
// error, then exits like die().
#define cudaCheck(call) cuda_check((call), #call, __FILE__, __LINE__)
static inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
    if (err != cudaSuccess) {
        fflush(stdout);
        fprintf(stderr, "error: CUDA error at %s:%d: %s\n       in %s\n", file, line, cudaGetErrorString(err), what);
        exit(1);
    }
}
// After a kernel launch: catches bad launch configurations at once (asynchronous faults
// surface at the next synchronising call, which is checked too).
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())

// --profile's recorder (PROFILE_OP in every kernel entry point), timed with CUDA events
// (profile_events.cuh, which needs cudaCheck). Included here, at global scope and before any
// kernel: the kernel lab and test_cuda_kernels include the CPU kernels, which include it too,
// inside `namespace cpu { }` as their reference, where it must already have been read.
#include "../profile.h"

// floatX <-> float, for both builds
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ floatX from_float(float x) {
#ifdef ENABLE_FP32
    return x;
#else
    return __float2bfloat16_rn(x);
#endif
}

static inline int grid_for(size_t n, int block) {
    size_t g = ceil_div(n, (size_t)block);
    return (int)(g < 65536 * 16 ? g : 65536 * 16);   // kernels that use this loop grid-stride
}

// sum / max over the 32 lanes of a warp (butterfly: every lane gets the result, same order
// on every run)
__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, off); }
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off)); }
    return v;
}
// Sum or max over a block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `shared` must hold 32 floats. Deterministic: a fixed tree. Op: a warp-wide reduction
// and its identity (what the lanes beyond the last warp contribute).
struct SumOp { __device__ static float warp(float v) { return warp_sum(v); } static constexpr float identity = 0.0f; };
struct MaxOp { __device__ static float warp(float v) { return warp_max(v); } static constexpr float identity = -INFINITY; };
template <typename Op>
__device__ inline float block_reduce(float v, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = Op::warp(v);
    __syncthreads();   // shared may still be read by a previous call
    if (lane == 0) { shared[warp] = v; }
    __syncthreads();
    v = lane < nwarps ? shared[lane] : Op::identity;
    return Op::warp(v);
}
__device__ inline float block_sum(float v, float* shared) { return block_reduce<SumOp>(v, shared); }
__device__ inline float block_max(float v, float* shared) { return block_reduce<MaxOp>(v, shared); }

// ---- deterministic column sums
// Several kernels need out[c] += sum over rows r of f(r, c) (bias and layernorm weight
// gradients). They write one partial sum per (row chunk, column) to a scratch buffer; this
// kernel adds the chunks up in chunk order, so the result never depends on timing.
__global__ void add_column_partials_kernel(floatX* out, const float* partials, int nchunks, int ncols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ncols) { return; }
    float s = 0.0f;
    for (int j = 0; j < nchunks; j++) { s += partials[(size_t)j * ncols + c]; }
    out[c] = from_float(to_float(out[c]) + s);
}

// Scratch device memory that grows on demand and is never freed (one per user, so two users
// never share one buffer). Allocation makes the caller wait for the GPU: it only happens on
// the first calls, never in the steady state of a training loop.
static inline void* scratch_reserve(void** buf, size_t* cap, size_t bytes) {
    if (bytes > *cap) {
        if (*buf) { cudaCheck(cudaFree(*buf)); }
        cudaCheck(cudaMalloc(buf, bytes));
        *cap = bytes;
    }
    return *buf;
}
