// The CPU backend's storage format (--precision fp32|bf16|fp16, doc/precision.md): every CPU
// kernel ends by rounding its floatX outputs with floatx_round (a no-op in fp32). Its own header so
// that each kernel header is self-contained: the kernel lab (dev/cuda/) and test_cuda_kernels.cu
// include llmc/cpu/*.h one by one, inside `namespace cpu`, as the reference.
#pragma once

#include <math.h>
#include <stddef.h>
#include "../precision.h"
#include "../profile.h"   // PROFILE_OP: each kernel entry point opens with one, timed under --profile

// The storage format of floatX tensors and what rounding to it did: values that were not
// zero and became zero (flushed: underflow) or were finite and became inf (overflow),
// counted separately for activations and gradients (the lab's underflow figures).
enum { ROUND_ACT, ROUND_GRAD, ROUND_COPY };
typedef struct {
    int prec;                                 // Precision: PREC_FP32, PREC_BF16, PREC_FP16
    int paused;                               // 1: round without counting (a recomputed block, llmc/model/recompute.h)
    double nonzero[2], flushed[2], overflowed[2];
} CpuPrecision;
static CpuPrecision cpu_prec = {PREC_FP32, 0, {0, 0}, {0, 0}, {0, 0}};

// --precision bf16|fp16: each value to the nearest of the format, the flushed and overflowed counted
static inline void floatx_round_narrow(float* p, size_t n, int kind) {
    int prec = cpu_prec.prec;
    size_t nonzero = 0, flushed = 0, over = 0;
    // one loop per format, so that the compiler inlines and vectorises the rounding
#define FLOATX_ROUND_LOOP(ROUND)                                                  \
    _Pragma("omp parallel for simd reduction(+ : nonzero, flushed, over)")         \
    for (size_t i = 0; i < n; i++) {                                              \
        float x = p[i], r = ROUND(x);                                             \
        nonzero += x != 0.0f;                                                     \
        flushed += (x != 0.0f) & (r == 0.0f);                                     \
        over += (fabsf(x) <= 3.4028235e38f) & !(fabsf(r) <= 3.4028235e38f);       \
        p[i] = r;                                                                 \
    }
    if (prec == PREC_BF16) { FLOATX_ROUND_LOOP(round_bf16) } else { FLOATX_ROUND_LOOP(round_fp16) }
#undef FLOATX_ROUND_LOOP
    if (kind != ROUND_COPY && !cpu_prec.paused) {
        cpu_prec.nonzero[kind] += (double)nonzero;
        cpu_prec.flushed[kind] += (double)flushed;
        cpu_prec.overflowed[kind] += (double)over;
    }
}
static inline void floatx_round(float* p, size_t n, int kind) {
    if (cpu_prec.prec != PREC_FP32 && p != NULL && n != 0) { floatx_round_narrow(p, n, kind); }   // fp32: nothing to do
}
