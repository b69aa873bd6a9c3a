// Causal multi-head attention that stores the T x T probabilities P of every head (att:
// B*NH*T*T floats), as the CPU does (llmc/cpu/attention.h): the kernel lab's version 2
// (attention_forward.cu, attention_backward.cu), against which the flash kernels of llmc/cuda
// are measured; test/test_cuda_kernels.cu checks it too. inp (B,T,3C) holds q | k | v; head h
// uses channels h*hs .. (h+1)*hs-1 of each; scale = 1/sqrt(hs).
// Forward: one warp per query row (scores, softmax, P @ V). Backward: one warp per row computes
// dS = P * (dP - rowsum(P * dP)) into a scratch T x T buffer; then one thread per output element
// sums dQ = scale dS K over keys and dK = scale dS^T Q, dV = P^T dO over queries, each in a
// fixed order.
#pragma once

#include "../../llmc/cuda/common.cuh"

static inline size_t attention_state_size_materialized(int B, int T, int NH) { return (size_t)B * NH * T * T; }

__global__ void attention_materialized_forward_kernel(floatX* out, float* att, const floatX* inp,
                                                      int B, int T, int C, int NH) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // = (b * NH + h) * T + t
    int lane = threadIdx.x % 32;
    if (row >= B * NH * T) { return; }
    int t = row % T, h = (row / T) % NH, b = row / (T * NH);
    int hs = C / NH;
    float scale = rsqrtf((float)hs);
    const floatX* q = inp + ((size_t)b * T + t) * 3 * C + h * hs;
    float* p = att + (size_t)row * T;
    float maxval = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const floatX* k = inp + ((size_t)b * T + t2) * 3 * C + C + h * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) { s += to_float(q[i]) * to_float(k[i]); }
        s *= scale;
        p[t2] = s;
        maxval = fmaxf(maxval, s);
    }
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) { float e = expf(p[t2] - maxval); p[t2] = e; sum += e; }
    float inv = 1.0f / warp_sum(sum);
    for (int t2 = lane; t2 < T; t2 += 32) { p[t2] = t2 <= t ? p[t2] * inv : 0.0f; }
    __syncwarp();   // the row of P, written by all lanes, is read by all lanes below
    for (int i = lane; i < hs; i += 32) {
        float o = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) { o += p[t2] * to_float(inp[((size_t)b * T + t2) * 3 * C + 2 * C + h * hs + i]); }
        out[((size_t)b * T + t) * C + h * hs + i] = from_float(o);
    }
}

// dS[row][t2] = P (dP - rowsum(P dP)) for t2 <= t, with dP[t2] = dO_t . v_t2 (unscaled)
__global__ void attention_materialized_ds_kernel(float* dS, const floatX* dout, const floatX* inp, const float* att,
                                                 int B, int T, int C, int NH) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= B * NH * T) { return; }
    int t = row % T, h = (row / T) % NH, b = row / (T * NH);
    int hs = C / NH;
    const floatX* dO = dout + ((size_t)b * T + t) * C + h * hs;
    const float* p = att + (size_t)row * T;
    float* ds = dS + (size_t)row * T;
    float rowdot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const floatX* v = inp + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
        float dp = 0.0f;
        for (int i = 0; i < hs; i++) { dp += to_float(dO[i]) * to_float(v[i]); }
        ds[t2] = dp;
        rowdot += p[t2] * dp;
    }
    rowdot = warp_sum(rowdot);
    for (int t2 = lane; t2 <= t; t2 += 32) { ds[t2] = p[t2] * (ds[t2] - rowdot); }   // own elements only
}

// one thread per (b, t, h, i): dq over keys t2 <= t; dk, dv (for key position t) over queries >= t
__global__ void attention_materialized_dinp_kernel(floatX* dinp, const float* dS, const floatX* dout,
                                                   const floatX* inp, const float* att, int B, int T, int C, int NH) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) { return; }
    int hs = C / NH;
    int c = (int)(idx % C), t = (int)((idx / C) % T), b = (int)(idx / ((size_t)C * T));
    int h = c / hs;
    float scale = rsqrtf((float)hs);
    size_t head = ((size_t)b * NH + h) * T;   // row index of (b, h, 0) in att and dS
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        dq += dS[(head + t) * T + t2] * to_float(inp[((size_t)b * T + t2) * 3 * C + C + c]);
    }
    for (int tq = t; tq < T; tq++) {
        dk += dS[(head + tq) * T + t] * to_float(inp[((size_t)b * T + tq) * 3 * C + c]);
        dv += att[(head + tq) * T + t] * to_float(dout[((size_t)b * T + tq) * C + c]);
    }
    floatX* d = dinp + ((size_t)b * T + t) * 3 * C;
    d[c] = from_float(dq * scale);
    d[C + c] = from_float(dk * scale);
    d[2 * C + c] = from_float(dv);
}

static inline void attention_forward_materialized(floatX* out, float* att, const floatX* inp, int B, int T, int C, int NH) {
    int rows = B * NH * T;
    attention_materialized_forward_kernel<<<(int)ceil_div(rows, 8), 256>>>(out, att, inp, B, T, C, NH);
    cudaCheckLaunch();
}

static inline void attention_backward_materialized(floatX* dinp, const floatX* dout, const floatX* inp, const float* att,
                                                   int B, int T, int C, int NH) {
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    float* dS = (float*)scratch_reserve(&scratch, &scratch_cap, attention_state_size_materialized(B, T, NH) * sizeof(float));
    int rows = B * NH * T;
    attention_materialized_ds_kernel<<<(int)ceil_div(rows, 8), 256>>>(dS, dout, inp, att, B, T, C, NH);
    cudaCheckLaunch();
    attention_materialized_dinp_kernel<<<(int)ceil_div((size_t)B * T * C, 256), 256>>>(dinp, dS, dout, inp, att, B, T, C, NH);
    cudaCheckLaunch();
}
