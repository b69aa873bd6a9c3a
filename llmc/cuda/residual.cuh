// Residual connection: out = inp1 + inp2 (elementwise; fp32 add, one rounding to floatX).
// Its backward is the identity into both branches, so there is no kernel for it (see
// "dresidual" in llmc/model/gpt2.h).
#pragma once

#include "common.cuh"

__global__ void residual_forward_kernel(floatX* out, const floatX* inp1, const floatX* inp2, size_t N) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = from_float(to_float(inp1[i]) + to_float(inp2[i]));
    }
}

static inline void residual_forward(floatX* out, const floatX* inp1, const floatX* inp2, size_t N) {
    PROFILE_OP("residual", OP_FWD, cost_residual_forward((double)N));
    residual_forward_kernel<<<grid_for(N, 512), 512>>>(out, inp1, inp2, N);
    cudaCheckLaunch();
}
