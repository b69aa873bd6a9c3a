// CUDA backend memory: tensors live in GPU memory; host code moves them only with these
// calls (the same names as llmc/cpu/memory.h). Copies are synchronous: when a copy to the
// host returns, every kernel launched before it has finished and the data is there.
#pragma once

#include "common.cuh"
#include "device.cuh"   // backend_ensure_init

#ifdef ENABLE_FP32
#define BACKEND_NAME "cuda (fp32, cuBLASLt without TF32)"
#define BACKEND_MASTER_WEIGHTS 0
#else
#define BACKEND_NAME "cuda (bf16 mixed precision, fp32 master weights)"
#define BACKEND_MASTER_WEIGHTS 1   // AdamW updates an fp32 copy; parameters get it rounded to bf16
#endif

static inline void* device_malloc(size_t bytes) {
    backend_ensure_init();
    if (bytes == 0) { bytes = 64; }
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();   // clear the error so the query below works
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        die("out of GPU memory: asked for %.1f MiB, %.1f MiB free of %.1f MiB on this device (%s); "
            "use a smaller --batch or --seq", bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0,
            cudaGetErrorString(err));
    }
    return p;
}
static inline void device_free(void* p) { if (p) { cudaCheck(cudaFree(p)); } }
// All the memory there is to allocate from: this GPU's memory. Shapes that need more are refused
// before they are allocated.
static inline size_t device_memory_total() {
    backend_ensure_init();
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    return total_b;
}
static inline void device_memset_zero(void* p, size_t bytes) { cudaCheck(cudaMemset(p, 0, bytes)); }
static inline void copy_host_to_device(void* dst, const void* src, size_t bytes) {
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static inline void copy_device_to_host(void* dst, const void* src, size_t bytes) {
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static inline void copy_device_to_device(void* dst, const void* src, size_t bytes) {
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

// ---- fp32 <-> floatX conversions (round to nearest even when narrowing)
__global__ void float_to_floatX_kernel(floatX* dst, const float* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = from_float(src[i]);
    }
}
__global__ void floatX_to_float_kernel(float* dst, const floatX* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = to_float(src[i]);
    }
}

// device floatX -> device fp32 (seeds the fp32 master weights from the parameters)
static inline void convert_floatX_to_float(float* dst, const floatX* src, size_t n) {
    floatX_to_float_kernel<<<grid_for(n, 256), 256>>>(dst, src, n);
    cudaCheckLaunch();
}

// Host fp32 arrays <-> device floatX tensors, staged through an fp32 device buffer in chunks
// of at most 16M floats (64 MiB), so a 1.5B-parameter model needs no 6 GB staging buffer.
#define COPY_CHUNK ((size_t)1 << 24)
static inline void copy_floats_to_device(floatX* dst, const float* src, size_t n) {
#ifdef ENABLE_FP32
    copy_host_to_device(dst, src, n * sizeof(float));
#else
    float* stage = (float*)device_malloc((n < COPY_CHUNK ? n : COPY_CHUNK) * sizeof(float));
    for (size_t i = 0; i < n; i += COPY_CHUNK) {
        size_t m = n - i < COPY_CHUNK ? n - i : COPY_CHUNK;
        copy_host_to_device(stage, src + i, m * sizeof(float));
        float_to_floatX_kernel<<<grid_for(m, 256), 256>>>(dst + i, stage, m);
        cudaCheckLaunch();
    }
    device_free(stage);   // cudaFree waits for the kernels
#endif
}
static inline void copy_floats_to_host(float* dst, const floatX* src, size_t n) {
#ifdef ENABLE_FP32
    copy_device_to_host(dst, src, n * sizeof(float));
#else
    float* stage = (float*)device_malloc((n < COPY_CHUNK ? n : COPY_CHUNK) * sizeof(float));
    for (size_t i = 0; i < n; i += COPY_CHUNK) {
        size_t m = n - i < COPY_CHUNK ? n - i : COPY_CHUNK;
        floatX_to_float_kernel<<<grid_for(m, 256), 256>>>(stage, src + i, m);
        cudaCheckLaunch();
        copy_device_to_host(dst + i, stage, m * sizeof(float));
    }
    device_free(stage);
#endif
}
