// CPU backend: "device" memory is ordinary host memory, and floatX is fp32.
// The model code only ever touches tensor memory through these calls, so the CUDA
// backend (llmc/cuda/memory.cuh) can put the same tensors in GPU memory.
//
// Reduced precision, simulated (--precision bf16|fp16, doc/precision.md): floatX stays a
// 4-byte float, but every kernel stores its floatX outputs ROUNDED to the 16-bit format
// (floatx_round at the end of each kernel in llmc/cpu/), so parameters, activations and
// gradients hold exactly the values a 16-bit tensor would, while the sums inside a kernel
// run in fp32 as the GPU's do. A kernel that accumulates into its output (dW += ...) adds
// its fp32 sum to the stored value and rounds once: the GPU's read-add-round. The optimizer
// keeps fp32 master weights and moments and writes the parameters rounded from them
// (stochastically for bf16, as llmc/cuda/adamw.cuh). Memory is not halved: the numbers are.
#pragma once

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../common.h"
#include "round.h"   // --precision: floatx_round, the CPU kernels' storage format

typedef float floatX;                   // the type of parameters and activations
#define BACKEND_NAME "cpu (fp32 storage; --precision bf16|fp16 rounds it, OpenMP)"

static inline void* device_malloc(size_t bytes) {
    if (bytes == 0) { bytes = 64; }
    void* p = aligned_alloc(64, ceil_div(bytes, 64) * 64);   // 64: one cache line / AVX-512 register
    if (p == NULL) { die("out of host memory allocating %.1f MiB", bytes / 1048576.0); }
    return p;
}
static inline void device_free(void* p) { free(p); }
// All the memory there is to allocate from: the machine's physical memory (on the CPU "device"
// memory is host memory). Shapes that need more are refused before they are allocated.
static inline size_t device_memory_total() {
    return (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}
// in pieces of 1 MiB over the threads: one core alone does not fill the memory's bandwidth
static inline void device_memset_zero(void* p, size_t bytes) {
    const size_t piece = (size_t)1 << 20, n = ceil_div(bytes, piece);
    #pragma omp parallel for schedule(static) if (bytes >= 8 * piece)
    for (size_t i = 0; i < n; i++) {
        size_t off = i * piece;
        memset((char*)p + off, 0, bytes - off < piece ? bytes - off : piece);
    }
}
static inline void copy_host_to_device(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void copy_device_to_host(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void copy_device_to_device(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }

// fp32 host arrays <-> floatX tensors (the CUDA backend converts to/from bf16 here)
static inline void copy_floats_to_device(floatX* dst, const float* src, size_t n) {
    memcpy(dst, src, n * sizeof(float));
    floatx_round(dst, n, ROUND_COPY);   // as the CUDA backend's conversion to bf16
}
static inline void copy_floats_to_host(float* dst, const floatX* src, size_t n) { memcpy(dst, src, n * sizeof(float)); }
// device floatX -> device fp32 (the CUDA backend widens bf16 here to seed the fp32 master weights)
static inline void convert_floatX_to_float(float* dst, const floatX* src, size_t n) { memcpy(dst, src, n * sizeof(float)); }
// 1 when the backend keeps an fp32 master copy of the parameters (floatX narrower than fp32:
// here, when --precision rounds the stored values)
#define BACKEND_MASTER_WEIGHTS (cpu_prec.prec != PREC_FP32)
