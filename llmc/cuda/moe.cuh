// The pieces of the mixture-of-experts block on the GPU (the model is in llmc/model/moe_block.h): the
// router's softmax, gathering token rows for the experts, the gate-weighted sum of the experts'
// outputs and its backward, the router's backward, a scale. The formulas are in llmc/cpu/moe.h;
// the same names and signatures, with floatX for activations and fp32 for probabilities, gates
// and their gradients. All math in fp32; each output is rounded to floatX once.
//
// Layout of the work:
//   softmax, router backward: a warp per token row, its lanes striding over the E experts
//     (any E); the row's max and sums by warp_max / warp_sum (a fixed butterfly). The router
//     backward keeps the row's k (<= MOE_MAX_K) chosen experts and their dp terms in
//     registers and computes dp[e] twice (once for sum_e p dp, once for the output) rather
//     than storing a row of E values.
//   combine backward: a warp per assignment (t, j): the lanes stride over the C channels, each
//     writes its dy[s, c] after reading y[s, c] (so dy may be y: in place), and warp_sum adds
//     the dot product dw.
//   gather, combine, scale: a thread per output element (grid-stride); combine adds its k
//     terms in the order j = 0..k-1, as the CPU does.
// Deterministic: every output is computed by one thread or warp in a fixed order; no atomics.
// An empty problem (N, n = 0) launches nothing (an empty grid is a launch error).
#pragma once

#include "common.cuh"

#define MOE_MAX_K 8            // the most experts a token is sent to (registers of the router backward)
#define MOE_ROWS_PER_BLOCK 8   // warp-per-row kernels: 8 warps, 256 threads

__global__ void moe_softmax_kernel(float* probs, const floatX* logits, int N, int E) {
    int t = blockIdx.x * MOE_ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= N) { return; }   // the whole warp: the shuffles below see all 32 lanes
    const floatX* z = logits + (size_t)t * E;
    float* p = probs + (size_t)t * E;
    float maxval = -INFINITY;
    for (int e = lane; e < E; e += 32) { maxval = fmaxf(maxval, to_float(z[e])); }
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) { sum += expf(to_float(z[e]) - maxval); }
    float inv = 1.0f / warp_sum(sum);
    for (int e = lane; e < E; e += 32) { p[e] = expf(to_float(z[e]) - maxval) * inv; }
}

__global__ void moe_gather_rows_kernel(floatX* dst, const floatX* src, const int* idx, int n, int C) {
    size_t total = (size_t)n * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C, c = i % C;
        dst[i] = src[(size_t)idx[r] * C + c];
    }
}

__global__ void moe_combine_kernel(floatX* out, const floatX* y, const int* slot, const float* w, int N, int k, int C,
                                   int accumulate) {
    size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / C, c = i % C;
        float acc = accumulate ? to_float(out[i]) : 0.0f;
        for (int j = 0; j < k; j++) {
            int s = slot[t * k + j];
            if (s < 0) { continue; }   // dropped
            float wj = w ? w[t * k + j] : 1.0f;
            acc += wj * to_float(y[(size_t)s * C + c]);
        }
        out[i] = from_float(acc);
    }
}

__global__ void moe_combine_backward_kernel(floatX* dy, float* dw, const floatX* dout, const floatX* y, const int* slot,
                                            const float* w, int N, int k, int C) {
    size_t i = (size_t)blockIdx.x * MOE_ROWS_PER_BLOCK + threadIdx.x / 32;   // the assignment (t, j) = (i / k, i % k)
    int lane = threadIdx.x % 32;
    if (i >= (size_t)N * k) { return; }   // the whole warp
    int s = slot[i];
    if (s < 0) {   // dropped: no gradient to the gate, no row of dy
        if (lane == 0) { dw[i] = 0.0f; }
        return;
    }
    const floatX* d = dout + (i / k) * C;
    const floatX* ys = y + (size_t)s * C;
    floatX* dys = dy + (size_t)s * C;
    float wi = w[i], sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dc = to_float(d[c]);
        sum += dc * to_float(ys[c]);   // read before this lane writes the same element (dy may be y)
        dys[c] = from_float(wi * dc);
    }
    sum = warp_sum(sum);
    if (lane == 0) { dw[i] = sum; }
}

// dp[t, e] of the router backward: the chosen experts' terms in the order j = 0..k-1, then the aux term
__device__ __forceinline__ float moe_dp(int e, const int* ix, const float* coef, int k, const float* aux) {
    float dp = 0.0f;
    #pragma unroll
    for (int j = 0; j < MOE_MAX_K; j++) {
        if (j < k && ix[j] == e) { dp += coef[j]; }
    }
    if (aux) { dp += aux[e]; }
    return dp;
}

__global__ void moe_router_backward_kernel(floatX* dlogits, const float* probs, const int* idx, const float* dgate,
                                           const float* aux_grad, int N, int E, int k, int T) {
    int t = blockIdx.x * MOE_ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= N) { return; }   // the whole warp
    const float* p = probs + (size_t)t * E;
    const int* idx_t = idx + (size_t)t * k;
    const float* dg = dgate + (size_t)t * k;
    // coef[j] = d loss / d p[t, ix[j]] through the gates (every lane computes the same, in order)
    int ix[MOE_MAX_K];
    float coef[MOE_MAX_K];
    #pragma unroll
    for (int j = 0; j < MOE_MAX_K; j++) { ix[j] = j < k ? idx_t[j] : -1; coef[j] = 0.0f; }
    if (k == 1) {
        coef[0] = dg[0];   // gate = p (Switch)
    } else {
        float S = 0.0f, G = 0.0f;   // S = sum_j p_j, G = sum_j g_j dgate_j
        #pragma unroll
        for (int j = 0; j < MOE_MAX_K; j++) { if (j < k) { S += p[ix[j]]; } }
        #pragma unroll
        for (int j = 0; j < MOE_MAX_K; j++) { if (j < k) { G += (p[ix[j]] / S) * dg[j]; } }
        #pragma unroll
        for (int j = 0; j < MOE_MAX_K; j++) { if (j < k) { coef[j] = (dg[j] - G) / S; } }
    }
    const float* aux = aux_grad ? aux_grad + (size_t)(t / T) * E : NULL;
    float dot = 0.0f;
    for (int e = lane; e < E; e += 32) { dot += p[e] * moe_dp(e, ix, coef, k, aux); }
    dot = warp_sum(dot);
    floatX* dz = dlogits + (size_t)t * E;
    for (int e = lane; e < E; e += 32) { dz[e] = from_float(p[e] * (moe_dp(e, ix, coef, k, aux) - dot)); }
}

__global__ void moe_scale_kernel(floatX* x, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        x[i] = from_float(to_float(x[i]) * s);
    }
}

// ---------------------------------------------------------------------------------------
// the launches (the signatures of llmc/cpu/moe.h)

static inline int moe_warp_grid(size_t rows) { return (int)ceil_div(rows, MOE_ROWS_PER_BLOCK); }

// probs (N, E) fp32 = softmax over E of logits (N, E)
static inline void moe_softmax(float* probs, const floatX* logits, int N, int E) {
    if (N <= 0) { return; }
    moe_softmax_kernel<<<moe_warp_grid(N), 32 * MOE_ROWS_PER_BLOCK>>>(probs, logits, N, E);
    cudaCheckLaunch();
}

// dst[i, :] = src[idx[i], :] for i < n
static inline void moe_gather_rows(floatX* dst, const floatX* src, const int* idx, int n, int C) {
    if (n <= 0) { return; }
    moe_gather_rows_kernel<<<grid_for((size_t)n * C, 512), 512>>>(dst, src, idx, n, C);
    cudaCheckLaunch();
}

// out[t, :] = (accumulate ? out[t, :] : 0) + sum_{j < k, slot >= 0} w[t*k+j] y[slot[t*k+j], :]
static inline void moe_combine(floatX* out, const floatX* y, const int* slot, const float* w, int N, int k, int C,
                               int accumulate) {
    if (N <= 0) { return; }
    moe_combine_kernel<<<grid_for((size_t)N * C, 512), 512>>>(out, y, slot, w, N, k, C, accumulate);
    cudaCheckLaunch();
}

// dy[s, :] = w dout[t, :], dw[t*k+j] = dout[t, :] . y[s, :] (0 for a dropped slot)
static inline void moe_combine_backward(floatX* dy, float* dw, const floatX* dout, const floatX* y, const int* slot,
                                        const float* w, int N, int k, int C) {
    if (N <= 0) { return; }
    moe_combine_backward_kernel<<<moe_warp_grid((size_t)N * k), 32 * MOE_ROWS_PER_BLOCK>>>(dy, dw, dout, y, slot, w,
                                                                                            N, k, C);
    cudaCheckLaunch();
}

// dlogits (N, E) from dgate (N, k), probs (N, E), idx (N, k), aux_grad (N / T, E) or NULL
static inline void moe_router_backward(floatX* dlogits, const float* probs, const int* idx, const float* dgate,
                                       const float* aux_grad, int N, int E, int k, int T) {
    if (k < 1 || k > MOE_MAX_K) { die("moe_router_backward: k = %d, the CUDA kernel supports 1..%d", k, MOE_MAX_K); }
    if (N <= 0) { return; }
    moe_router_backward_kernel<<<moe_warp_grid(N), 32 * MOE_ROWS_PER_BLOCK>>>(dlogits, probs, idx, dgate, aux_grad,
                                                                              N, E, k, T);
    cudaCheckLaunch();
}

// x[i] *= s for i < n
static inline void moe_scale(floatX* x, size_t n, float s) {
    if (n == 0) { return; }
    moe_scale_kernel<<<grid_for(n, 512), 512>>>(x, n, s);
    cudaCheckLaunch();
}
