// The local reduce on device buffers: the GPU twin of comm_reduce_local_host and
// comm_avg_finish_host (reduce_local_host.h), with the same arithmetic so that a device run
// matches a host run bit for bit:
//   fp32   d = d op s                      (IEEE add, compare; avg divides by (float)p)
//   int32  sum wraps in uint32; avg divides with C's truncation toward zero
//   bf16   widened to fp32, reduced, rounded back to nearest-even (NaN stays NaN)
// plus the bf16 <-> fp32 conversions the native NCCL reductions use to accumulate bf16 in fp32.
// One grid-stride kernel per job; the launchers check the launch and leave synchronisation to
// the caller (comm.h and native.h synchronise before they return).
//
// Included by comm_nccl.h, in the CUDA build only (LLMC_CUDA_COMM).
#pragma once

#include <cuda_runtime.h>
#include "comm_types.h"

__device__ __forceinline__ float comm_dev_bf16_to_float(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t comm_dev_float_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 0x40); }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

template <typename T>
__device__ __forceinline__ T comm_dev_apply(T a, T b, int op) {
    if (op == COMM_MAX) { return a > b ? a : b; }
    if (op == COMM_MIN) { return a < b ? a : b; }
    return a + b;
}

__global__ void comm_reduce_local_kernel(void* dst, const void* src, size_t n, int type, int op) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (type == COMM_FP32) {
            float* d = (float*)dst;
            d[i] = comm_dev_apply(d[i], ((const float*)src)[i], op);
        } else if (type == COMM_INT32) {
            int32_t* d = (int32_t*)dst;
            int32_t s = ((const int32_t*)src)[i];
            d[i] = (op == COMM_SUM || op == COMM_AVG) ? (int32_t)((uint32_t)d[i] + (uint32_t)s) : comm_dev_apply(d[i], s, op);
        } else {
            uint16_t* d = (uint16_t*)dst;
            float a = comm_dev_bf16_to_float(d[i]), b = comm_dev_bf16_to_float(((const uint16_t*)src)[i]);
            d[i] = comm_dev_float_to_bf16(comm_dev_apply(a, b, op));
        }
    }
}

__global__ void comm_avg_finish_kernel(void* buf, size_t n, int type, int p) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (type == COMM_FP32) {
            float* b = (float*)buf;
            b[i] = b[i] / (float)p;
        } else if (type == COMM_INT32) {
            int32_t* b = (int32_t*)buf;
            b[i] = b[i] / p;
        } else {
            uint16_t* b = (uint16_t*)buf;
            b[i] = comm_dev_float_to_bf16(comm_dev_bf16_to_float(b[i]) / (float)p);
        }
    }
}

__global__ void comm_bf16_widen_kernel(float* dst, const uint16_t* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = comm_dev_bf16_to_float(src[i]);
    }
}
__global__ void comm_bf16_narrow_kernel(uint16_t* dst, const float* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = comm_dev_float_to_bf16(src[i]);
    }
}

// grid for a grid-stride loop over n elements: enough blocks to fill a GPU, never zero
static inline unsigned comm_dev_grid(size_t n) {
    size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks == 0 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

// The launchers return the launch error (cudaSuccess when n == 0: nothing is launched).
static inline cudaError_t comm_reduce_local_launch(void* dst, const void* src, size_t n, CommType t, CommOp op, cudaStream_t s) {
    if (n == 0) { return cudaSuccess; }
    comm_reduce_local_kernel<<<comm_dev_grid(n), 256, 0, s>>>(dst, src, n, (int)t, (int)op);
    return cudaGetLastError();
}
static inline cudaError_t comm_avg_finish_launch(void* buf, size_t n, CommType t, int p, cudaStream_t s) {
    if (n == 0) { return cudaSuccess; }
    comm_avg_finish_kernel<<<comm_dev_grid(n), 256, 0, s>>>(buf, n, (int)t, p);
    return cudaGetLastError();
}
static inline cudaError_t comm_bf16_widen_launch(float* dst, const void* src, size_t n, cudaStream_t s) {
    if (n == 0) { return cudaSuccess; }
    comm_bf16_widen_kernel<<<comm_dev_grid(n), 256, 0, s>>>(dst, (const uint16_t*)src, n);
    return cudaGetLastError();
}
static inline cudaError_t comm_bf16_narrow_launch(void* dst, const float* src, size_t n, cudaStream_t s) {
    if (n == 0) { return cudaSuccess; }
    comm_bf16_narrow_kernel<<<comm_dev_grid(n), 256, 0, s>>>((uint16_t*)dst, src, n);
    return cudaGetLastError();
}
