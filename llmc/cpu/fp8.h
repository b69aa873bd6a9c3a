// FP8, simulated (llmc/model/fp8_linear.h): the largest magnitude of a tensor, and "fake quantisation":
//   out = round_fp8(in * scale) / scale
// which is the value an FP8 tensor with that scale holds, back in floatX. With a power-of-two
// scale the division is exact, so out is what an FP8 GEMM would read, and the matmul that
// follows accumulates it in fp32 as the tensor cores do.
#pragma once

#include <math.h>
#include "../precision.h"

// max |x| over n values; NaN when any value is NaN (the scale then poisons the step, which the
// loss scaler or --on-nan sees)
static inline float fp8_absmax(const float* x, size_t n) {
    float a = 0.0f;
    int nan = 0;
    #pragma omp parallel for reduction(max : a) reduction(| : nan)
    for (size_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v != v) { nan = 1; }
        else if (v > a) { a = v; }
    }
    return nan ? NAN : a;
}

// e5m2 = 0: E4M3 (forward: activations and weights), 1: E5M2 (backward: gradients); both
// saturate at their largest finite value (a delayed scale may not have seen this amax)
static inline void fp8_quantize(float* out, const float* in, size_t n, float scale, int e5m2) {
    float inv = 1.0f / scale;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float q = e5m2 ? round_e5m2_sat(in[i] * scale) : round_e4m3(in[i] * scale);
        out[i] = q * inv;
    }
}
