// The GPU's copy_rows, store_rows, add_floats and fill_floats (llmc/cpu/rows.h says what they
// are for): elementwise grid-stride kernels.
#pragma once

#include "common.cuh"

// rows between layouts; fp32 buffers. dst(b, i, c) = src(b, i, c), b < B, i < rows, c < width.

__global__ void copy_rows_kernel(floatX* dst, int dst_seq, int dst_ld, const floatX* src, int src_seq, int src_ld,
                                 int B, int rows, int width) {
    size_t total = (size_t)B * rows * width;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % width);
        size_t r = idx / width;
        int i = (int)(r % rows), b = (int)(r / rows);
        dst[((size_t)b * dst_seq + i) * dst_ld + c] = src[((size_t)b * src_seq + i) * src_ld + c];
    }
}
static inline void copy_rows(floatX* dst, int dst_seq, int dst_ld, const floatX* src, int src_seq, int src_ld,
                             int B, int rows, int width) {
    size_t total = (size_t)(B > 0 ? B : 0) * (rows > 0 ? rows : 0) * (width > 0 ? width : 0);
    if (total == 0) { return; }
    copy_rows_kernel<<<grid_for(total, 256), 256>>>(dst, dst_seq, dst_ld, src, src_seq, src_ld, B, rows, width);
    cudaCheckLaunch();
}

// the same, fp32 -> floatX (round to nearest even)
__global__ void store_rows_kernel(floatX* dst, int dst_seq, int dst_ld, const float* src, int src_seq, int src_ld,
                                  int B, int rows, int width) {
    size_t total = (size_t)B * rows * width;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % width);
        size_t r = idx / width;
        int i = (int)(r % rows), b = (int)(r / rows);
        dst[((size_t)b * dst_seq + i) * dst_ld + c] = from_float(src[((size_t)b * src_seq + i) * src_ld + c]);
    }
}
static inline void store_rows(floatX* dst, int dst_seq, int dst_ld, const float* src, int src_seq, int src_ld,
                              int B, int rows, int width) {
    size_t total = (size_t)(B > 0 ? B : 0) * (rows > 0 ? rows : 0) * (width > 0 ? width : 0);
    if (total == 0) { return; }
    store_rows_kernel<<<grid_for(total, 256), 256>>>(dst, dst_seq, dst_ld, src, src_seq, src_ld, B, rows, width);
    cudaCheckLaunch();
}

__global__ void add_floats_kernel(float* dst, const float* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] += src[i];
    }
}
// dst[i] += src[i]
static inline void add_floats(float* dst, const float* src, size_t n) {
    if (n == 0) { return; }
    add_floats_kernel<<<grid_for(n, 256), 256>>>(dst, src, n);
    cudaCheckLaunch();
}

__global__ void fill_floats_kernel(float* p, float value, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        p[i] = value;
    }
}
static inline void fill_floats(float* p, float value, size_t n) {
    if (n == 0) { return; }
    fill_floats_kernel<<<grid_for(n, 256), 256>>>(p, value, n);
    cudaCheckLaunch();
}
