// Sum of squares of the gradients, for the global norm used in clipping (llmc/cpu/global_norm.h).
// Deterministic: a grid that depends only on the count (GN_BLOCKS x GN_THREADS, or fewer blocks
// for fewer than GN_BLOCKS * GN_THREADS values; the same on every GPU) strides over the array,
// each thread accumulating in fp32 (a few hundred elements each for GPT-2 124M), each block sums
// its threads in a fixed tree and writes one partial; a single block then adds the partials in
// double, in a fixed tree. out is one float on the device.
#pragma once

#include "common.cuh"

#define GN_BLOCKS 512
#define GN_THREADS 512

__global__ void global_norm_partial_kernel(float* partial, const floatX* values, size_t count) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float v = to_float(values[i]);
        s += v * v;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) { partial[blockIdx.x] = s; }
}

__global__ void global_norm_final_kernel(float* out, const float* partial, int n) {
    __shared__ double shared[GN_BLOCKS];
    shared[threadIdx.x] = (int)threadIdx.x < n ? (double)partial[threadIdx.x] : 0.0;
    __syncthreads();
    for (int stride = GN_BLOCKS / 2; stride > 0; stride >>= 1) {   // blockDim.x == GN_BLOCKS
        if ((int)threadIdx.x < stride) { shared[threadIdx.x] += shared[threadIdx.x + stride]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { *out = (float)shared[0]; }
}

static inline void global_norm_squared(float* out, const floatX* values, size_t count) {
    PROFILE_OP("global norm", OP_UPD, cost_global_norm((double)count));
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    float* partial = (float*)scratch_reserve(&scratch, &scratch_cap, GN_BLOCKS * sizeof(float));
    // GN_BLOCKS blocks, fewer for a small array: the data-parallel optimizer asks for the norm
    // of every segment of every layer, and 262,144 threads to add a few thousand squares are waste
    size_t wanted = ceil_div(count, (size_t)GN_THREADS);
    int blocks = (int)(wanted < 1 ? 1 : (wanted > GN_BLOCKS ? GN_BLOCKS : wanted));
    global_norm_partial_kernel<<<blocks, GN_THREADS>>>(partial, values, count);
    cudaCheckLaunch();
    global_norm_final_kernel<<<1, GN_BLOCKS>>>(out, partial, blocks);
    cudaCheckLaunch();
}
