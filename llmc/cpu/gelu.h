// GELU, the tanh approximation GPT-2 uses:
//   gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3*0.044715 x^2),  u = k (x + 0.044715 x^3)
// backward OVERWRITES dinp (dinp may alias dout: it is elementwise).
#pragma once

#define GELU_SCALE 0.7978845608028654f   // sqrt(2/pi)

static inline void gelu_forward(float* out, const float* inp, size_t N) {
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

static inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float du_dx = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
        dinp[i] = grad * dout[i];
    }
}
