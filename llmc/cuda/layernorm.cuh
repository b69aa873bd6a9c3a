// LayerNorm over channels, eps = 1e-5, biased variance (formulas in llmc/cpu/layernorm.h).
// forward:  one warp per row (b, t): mean, then variance from (x - mean)^2 (two passes over the
//           row, the second from L1/L2), fp32 statistics saved for the backward.
// backward: 1) one warp per row: the two row means of g = dout * w and g * xhat, then
//              dinp += rstd * (g - mean(g) - xhat * mean(g * xhat))          (ACCUMULATES)
//           2) dweight += sum_rows dout * xhat, dbias += sum_rows dout: deterministic column
//              sums. Blocks of 32 channels x 8 row-lanes cover chunks of LN_ROWS_PER_CHUNK rows;
//              each block writes its fp32 partial sums, then add_column_partials_kernel adds
//              the chunks in chunk order. No atomics: the same bits on every run.
#pragma once

#include "common.cuh"

#define LN_ROWS_PER_CHUNK 256

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) { return; }   // whole warps leave together
    const floatX* x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) { s += to_float(x[c]); }
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = to_float(x[c]) - m; v += d * d; }
    float r = rsqrtf(warp_sum(v) / C + 1e-5f);
    floatX* o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        o[c] = from_float((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

static inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                                     const floatX* weight, const floatX* bias, int B, int T, int C) {
    PROFILE_OP("layernorm", OP_FWD, cost_layernorm_forward((double)B * T, C));
    int N = B * T;
    const int block = 256;   // 8 rows per block
    layernorm_forward_kernel<<<(int)ceil_div(N, block / 32), block>>>(out, mean, rstd, inp, weight, bias, N, C);
    cudaCheckLaunch();
}

__global__ void layernorm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                               const floatX* weight, const float* mean, const float* rstd,
                                               int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) { return; }
    const floatX* x = inp + (size_t)row * C;
    const floatX* dy = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float g_sum = 0.0f, gx_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = to_float(dy[c]) * to_float(weight[c]);
        g_sum += g;
        gx_sum += g * (to_float(x[c]) - m) * r;
    }
    float g_mean = warp_sum(g_sum) / C, gx_mean = warp_sum(gx_sum) / C;
    floatX* dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (to_float(x[c]) - m) * r;
        float d = r * (to_float(dy[c]) * to_float(weight[c]) - g_mean - xhat * gx_mean);
        dx[c] = from_float(to_float(dx[c]) + d);
    }
}

// block (32, 8): threadIdx.x picks the channel, threadIdx.y strides over the chunk's rows
__global__ void layernorm_backward_params_kernel(float* partial_w, float* partial_b, const floatX* dout,
                                                 const floatX* inp, const float* mean, const float* rstd,
                                                 int N, int C) {
    __shared__ float sw[8][33], sb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int chunk = blockIdx.y;
    int r0 = chunk * LN_ROWS_PER_CHUNK, r1 = min(r0 + LN_ROWS_PER_CHUNK, N);
    float w = 0.0f, b = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float dy = to_float(dout[(size_t)r * C + c]);
            w += dy * (to_float(inp[(size_t)r * C + c]) - mean[r]) * rstd[r];
            b += dy;
        }
    }
    sw[threadIdx.y][threadIdx.x] = w;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) { w += sw[y][threadIdx.x]; b += sb[y][threadIdx.x]; }
        partial_w[(size_t)chunk * C + c] = w;
        partial_b[(size_t)chunk * C + c] = b;
    }
}

static inline void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                                      const floatX* inp, const floatX* weight, const float* mean,
                                      const float* rstd, int B, int T, int C) {
    PROFILE_OP("layernorm", OP_BWD, cost_layernorm_backward((double)B * T, C));
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    int N = B * T;
    if (dinp != NULL) {   // NULL: the zero-bubble W pass wants the weight gradients only
        layernorm_backward_dinp_kernel<<<(int)ceil_div(N, 8), 256>>>(dinp, dout, inp, weight, mean, rstd, N, C);
        cudaCheckLaunch();
    }
    if (dweight == NULL) { return; }   // the zero-bubble B pass: the input gradient only
    int nchunks = (int)ceil_div(N, LN_ROWS_PER_CHUNK);
    float* partial = (float*)scratch_reserve(&scratch, &scratch_cap, 2 * (size_t)nchunks * C * sizeof(float));
    float* partial_w = partial;
    float* partial_b = partial + (size_t)nchunks * C;
    dim3 grid((C + 31) / 32, nchunks);
    layernorm_backward_params_kernel<<<grid, dim3(32, 8)>>>(partial_w, partial_b, dout, inp, mean, rstd, N, C);
    cudaCheckLaunch();
    add_column_partials_kernel<<<(C + 255) / 256, 256>>>(dweight, partial_w, nchunks, C);
    cudaCheckLaunch();
    add_column_partials_kernel<<<(C + 255) / 256, 256>>>(dbias, partial_b, nchunks, C);
    cudaCheckLaunch();
}
