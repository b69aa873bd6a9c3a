// GELU, the tanh approximation GPT-2 uses (see llmc/cpu/gelu.h for the formulas):
//   gelu(x) = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
// Elementwise, fp32 math, one thread per element (grid-stride). Backward OVERWRITES dinp and
// may run in place (dinp == dout): each thread reads its element before writing it.
#pragma once

#include "common.cuh"

#define GELU_SCALE_F 0.7978845608028654f   // sqrt(2/pi)

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        float x = to_float(inp[i]);
        float u = GELU_SCALE_F * (x + 0.044715f * x * x * x);
        out[i] = from_float(0.5f * x * (1.0f + tanhf(u)));
    }
}

__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        float x = to_float(inp[i]);
        float u = GELU_SCALE_F * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float du_dx = GELU_SCALE_F * (1.0f + 3.0f * 0.044715f * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
        dinp[i] = from_float(grad * to_float(dout[i]));
    }
}

static inline void gelu_forward(floatX* out, const floatX* inp, size_t N) {
    PROFILE_OP("gelu", OP_FWD, cost_gelu_forward((double)N));
    gelu_forward_kernel<<<grid_for(N, 512), 512>>>(out, inp, N);
    cudaCheckLaunch();
}
static inline void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    PROFILE_OP("gelu", OP_BWD, cost_gelu_backward((double)N));
    gelu_backward_kernel<<<grid_for(N, 512), 512>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
}
