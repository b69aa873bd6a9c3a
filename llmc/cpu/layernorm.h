// LayerNorm over the channel dimension, eps = 1e-5, biased variance (as GPT-2).
//   forward:  mean_i = avg_c x[i,c],  rstd_i = 1/sqrt(var_i + eps)
//             xhat[i,c] = (x[i,c] - mean_i) * rstd_i,   out[i,c] = xhat[i,c] * w[c] + b[c]
//   backward: dw[c] += sum_i dout[i,c] * xhat[i,c],   db[c] += sum_i dout[i,c]
//             g = dout * w
//             dinp[i,c] += rstd_i * (g[i,c] - avg_c g[i,:] - xhat[i,c] * avg_c (g[i,:] * xhat[i,:]))
// dinp ACCUMULATES: GPT-2 adds the layernorm's input gradient into the residual stream's
// gradient (see gpt2_backward). mean and rstd are saved by forward for backward. The sums over
// a row run in vector lanes (omp simd): a fixed order, the same for any thread count.
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format

static inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int B, int T, int C) {
    PROFILE_OP("layernorm", OP_FWD, cost_layernorm_forward((double)B * T, C));
    const float eps = 1e-5f;
    int N = B * T;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        float m = 0.0f;
        #pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) { m += x[c]; }
        m /= C;
        float v = 0.0f;
        #pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        float* o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) { o[c] = (x[c] - m) * s * weight[c] + bias[c]; }
        mean[i] = m;
        rstd[i] = s;
    }
    floatx_round(out, (size_t)N * C, ROUND_ACT);
}

static inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int B, int T, int C) {
    PROFILE_OP("layernorm", OP_BWD, cost_layernorm_backward((double)B * T, C));
    int N = B * T;
    // 1) input gradient: rows are independent (skipped when dinp is NULL: the zero-bubble W pass)
    #pragma omp parallel for
    for (int i = 0; i < (dinp != NULL ? N : 0); i++) {
        const float* x = inp + (size_t)i * C;
        const float* dy = dout + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float g_mean = 0.0f, gx_mean = 0.0f;
        #pragma omp simd reduction(+ : g_mean, gx_mean)
        for (int c = 0; c < C; c++) {
            float g = dy[c] * weight[c];
            g_mean += g;
            gx_mean += g * (x[c] - m) * s;
        }
        g_mean /= C;
        gx_mean /= C;
        float* dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            dx[c] += s * (dy[c] * weight[c] - g_mean - xhat * gx_mean);
        }
    }
    // 2) weight and bias gradients: a sum over rows. Each thread owns blocks of 64 channels and
    //    walks every row in order, in one pass: no races, same result for any thread count.
    //    (skipped when dweight is NULL: the zero-bubble B pass)
    const int CB = 64;
    int nblocks = dweight != NULL ? (C + CB - 1) / CB : 0;
    #pragma omp parallel for
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * CB, n = c0 + CB < C ? CB : C - c0;
        float dw[CB], db[CB];
        for (int j = 0; j < n; j++) { dw[j] = dweight[c0 + j]; db[j] = dbias[c0 + j]; }
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C + c0, *dy = dout + (size_t)i * C + c0;
            for (int j = 0; j < n; j++) { dw[j] += dy[j] * (x[j] - mean[i]) * rstd[i]; db[j] += dy[j]; }
        }
        for (int j = 0; j < n; j++) { dweight[c0 + j] = dw[j]; dbias[c0 + j] = db[j]; }
    }
    floatx_round(dinp, (size_t)N * C, ROUND_GRAD);
    floatx_round(dweight, (size_t)C, ROUND_GRAD);
    floatx_round(dbias, (size_t)C, ROUND_GRAD);
}
