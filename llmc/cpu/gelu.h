// GELU, the tanh approximation GPT-2 uses:
//   gelu(x) = 0.5 x (1 + tanh(u)),   u = k (x + 0.044715 x^3),   k = sqrt(2/pi)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3*0.044715 x^2)
// backward OVERWRITES dinp (dinp may alias dout: it is elementwise).
// tanh(u) = 1 - 2 / (exp(2u) + 1) with exp_poly (exp_poly.h), which vectorises; within 3e-7 of tanhf.
#pragma once

#include "round.h"      // floatx_round: outputs stored in the --precision format
#include "exp_poly.h"

#define GELU_SCALE 0.7978845608028654f   // sqrt(2/pi)

static inline float tanh_via_exp(float u) { return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f); }

static inline void gelu_forward(float* out, const float* inp, size_t N) {
    PROFILE_OP("gelu", OP_FWD, cost_gelu_forward((double)N));
    #pragma omp parallel for simd
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_via_exp(u));
    }
    floatx_round(out, N, ROUND_ACT);
}

static inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    PROFILE_OP("gelu", OP_BWD, cost_gelu_backward((double)N));
    #pragma omp parallel for simd
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_via_exp(u);
        float du_dx = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
        dinp[i] = grad * dout[i];
    }
    floatx_round(dinp, N, ROUND_GRAD);
}
