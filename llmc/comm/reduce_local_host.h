// The local reduce on host memory, dst[i] = dst[i] op src[i]: the only arithmetic the
// collectives do. comm.h's comm_reduce_local and comm_avg_finish end here for host buffers;
// llmc/comm/reduce_local.cuh is the GPU twin, with the same arithmetic, so that a device run
// matches a host run bit for bit. Types: fp32; int32 (sums wrap; avg divides with C's
// truncation toward zero); bf16, stored as uint16, reduced in fp32 and rounded back to
// nearest-even. Also the host scratch buffers the algorithms and the tests work in.
#pragma once

#include "comm_types.h"

// --- bf16

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// Round to nearest, ties to even; NaN stays NaN.
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 0x40); }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// --- the local reduce. avg reduces as sum here; comm_avg_finish_host divides once the sum is
// complete.
//
// One plain loop per (type, op), the op chosen once outside the loop: then the compiler turns
// each loop into SIMD (8 floats per AVX2 instruction). A switch on the op inside the loop, per
// element, keeps it scalar: about 4x slower on fp32, which made the reduction, not the copy, the
// bottleneck of every reducing step between 256 KiB and a few MiB. Each element's arithmetic is
// the same either way (no reassociation), so the results are bit for bit those of before.

template <typename T>
static inline T comm_max(T a, T b) { return a > b ? a : b; }
template <typename T>
static inline T comm_min(T a, T b) { return a < b ? a : b; }

// d[i] = f(d[i], s[i]); f is a lambda, inlined into the loop
template <typename T, typename F>
static inline void comm_reduce_loop(T* d, const T* s, size_t n, F f) {
    for (size_t i = 0; i < n; i++) { d[i] = f(d[i], s[i]); }
}

// bf16: widen both to fp32, apply f, round back to nearest-even
template <typename F>
static inline void comm_reduce_loop_bf16(uint16_t* d, const uint16_t* s, size_t n, F f) {
    for (size_t i = 0; i < n; i++) { d[i] = float_to_bf16(f(bf16_to_float(d[i]), bf16_to_float(s[i]))); }
}

static inline void comm_reduce_local_host(void* dst, const void* src, size_t n, CommType t, CommOp op) {
    if (t == COMM_FP32) {
        float* d = (float*)dst;
        const float* s = (const float*)src;
        switch (op) {
            case COMM_MAX: comm_reduce_loop(d, s, n, [](float a, float b) { return comm_max(a, b); }); break;
            case COMM_MIN: comm_reduce_loop(d, s, n, [](float a, float b) { return comm_min(a, b); }); break;
            default: comm_reduce_loop(d, s, n, [](float a, float b) { return a + b; }); break;
        }
    } else if (t == COMM_INT32) {
        int32_t* d = (int32_t*)dst;
        const int32_t* s = (const int32_t*)src;
        switch (op) {
            case COMM_MAX: comm_reduce_loop(d, s, n, [](int32_t a, int32_t b) { return comm_max(a, b); }); break;
            case COMM_MIN: comm_reduce_loop(d, s, n, [](int32_t a, int32_t b) { return comm_min(a, b); }); break;
            // sum in uint32 so that overflow wraps (as MPI's does in practice) instead of being UB
            default: comm_reduce_loop(d, s, n, [](int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }); break;
        }
    } else {
        uint16_t* d = (uint16_t*)dst;
        const uint16_t* s = (const uint16_t*)src;
        switch (op) {
            case COMM_MAX: comm_reduce_loop_bf16(d, s, n, [](float a, float b) { return comm_max(a, b); }); break;
            case COMM_MIN: comm_reduce_loop_bf16(d, s, n, [](float a, float b) { return comm_min(a, b); }); break;
            default: comm_reduce_loop_bf16(d, s, n, [](float a, float b) { return a + b; }); break;
        }
    }
}

// avg = sum / p, the same arithmetic in every version so that results match bit for bit.
static inline void comm_avg_finish_host(void* buf, size_t n, CommType t, int p) {
    if (t == COMM_FP32) {
        float* b = (float*)buf;
        for (size_t i = 0; i < n; i++) { b[i] = b[i] / (float)p; }
    } else if (t == COMM_INT32) {
        int32_t* b = (int32_t*)buf;
        for (size_t i = 0; i < n; i++) { b[i] = b[i] / p; }
    } else {
        uint16_t* b = (uint16_t*)buf;
        for (size_t i = 0; i < n; i++) { b[i] = float_to_bf16(bf16_to_float(b[i]) / (float)p); }
    }
}

// --- host scratch

#ifdef LLMC_CUDA_COMM
// Host scratch buffers handed out by comm_scratch(n, t) in this process: the scratch of host
// communicators, of the staged wire's native collectives (MPI on host copies) and the tests'
// buffers, never an algorithm's on a device communicator (test_collectives_device checks that no
// device call moves it).
static inline uint64_t& comm_host_scratch_count() {
    static uint64_t n = 0;
    return n;
}
#endif

// Host memory for n elements, released with free(): the tests' and collbench's buffers, and the
// scratch of host communicators (comm.h's comm_scratch(c, ...)).
static inline void* comm_scratch(size_t n, CommType t) {
    void* p = malloc(n == 0 ? 1 : n * comm_type_size(t));
    if (p == NULL) { die("out of host memory allocating a %zu-element scratch buffer", n); }
#ifdef LLMC_CUDA_COMM
    comm_host_scratch_count() += 1;
#endif
    return p;
}
