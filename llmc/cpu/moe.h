// The pieces of the mixture-of-experts block (the model and its rules are in llmc/model/moe_block.h): the
// router's softmax, moving token rows to and from the experts, the weighted sum of
// the experts' outputs, and the backward of each. The experts themselves are plain linear
// layers (matmul.h) and GELU (gelu.h) on the rows gathered for them.
//
// Notation: N token rows of C channels, E experts, each token sends k assignments (t, j),
// j = 0..k-1, to its top-k experts; slot[t*k + j] is the row of that assignment in the experts'
// stacked output y (-1: dropped by the capacity limit); w[t*k + j] its gate weight.
//
//   softmax : p[t, e] = exp(z[t, e] - m_t) / sum_e' exp(z[t, e'] - m_t),  m_t = max_e z[t, e]
//   gather  : dst[i, :] = src[idx[i], :]
//   combine : out[t, :] = (accumulate ? out[t, :] : 0) + sum_{j, slot >= 0} w[t*k+j] y[slot[t*k+j], :]
//             (w NULL: every weight 1; the terms are added in the order j = 0..k-1)
//   combine backward (each kept slot s is referred to once, so dy is written, not summed):
//             dy[s, :] = w[t*k+j] dout[t, :],   dw[t*k+j] = dout[t, :] . y[s, :]   (0 if dropped)
//   router backward, from the gates' gradient dgate to the logits' gradient:
//     the gates: k == 1: g = p[t, e_0] (Switch), so dp[t, e_0] = dgate[t];
//                k >= 2: g_j = p_j / S with p_j = p[t, e_j], S = sum_j p_j, so
//                dL/dp_j = sum_i dgate_i (delta_ij / S - p_i / S^2) = (dgate_j - sum_i g_i dgate_i) / S
//     the auxiliary loss: dp[t, e] += aux_grad[(t / T) * E + e], d aux / d p[t, e], the same for
//                every row t of a routing group of T rows (computed by the caller)
//     the softmax: dz[t, e] = p[t, e] (dp[t, e] - sum_e' p[t, e'] dp[t, e'])
//   scale   : x[i] *= s
//
// Every sum is in fp32 in a fixed order (threads split over rows, each row is summed by one
// thread): deterministic, no atomics. On the CPU floatX is float, so every floatX of the shared
// signatures is written float here (which also lets the CUDA test include this file as its
// reference, inside namespace cpu). dy may be y itself (in place): each row of y is read before
// the same thread overwrites it with dy.
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format

#include <math.h>
#include <stdlib.h>
#include <string.h>

// probs (N, E) = softmax over E of logits (N, E), with the max subtracted
static inline void moe_softmax(float* probs, const float* logits, int N, int E) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float* z = logits + (size_t)t * E;
        float* p = probs + (size_t)t * E;
        float maxval = -INFINITY;
        for (int e = 0; e < E; e++) { maxval = fmaxf(maxval, z[e]); }
        float sum = 0.0f;
        for (int e = 0; e < E; e++) { p[e] = expf(z[e] - maxval); sum += p[e]; }
        float inv = 1.0f / sum;
        for (int e = 0; e < E; e++) { p[e] *= inv; }
    }
}

// dst[i, :] = src[idx[i], :] for i < n, rows of C elements
static inline void moe_gather_rows(float* dst, const float* src, const int* idx, int n, int C) {
    #pragma omp parallel for
    for (int i = 0; i < n; i++) {
        memcpy(dst + (size_t)i * C, src + (size_t)idx[i] * C, (size_t)C * sizeof(float));
    }
}

// out[t, :] = (accumulate ? out[t, :] : 0) + sum_{j < k, slot >= 0} w[t*k+j] y[slot[t*k+j], :], for t < N
static inline void moe_combine(float* out, const float* y, const int* slot, const float* w, int N, int k, int C,
                               int accumulate) {
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) {
            float acc = accumulate ? o[c] : 0.0f;
            for (int j = 0; j < k; j++) {
                int s = slot[(size_t)t * k + j];
                if (s < 0) { continue; }   // dropped
                float wj = w ? w[(size_t)t * k + j] : 1.0f;
                acc += wj * y[(size_t)s * C + c];
            }
            o[c] = acc;
        }
    }
    floatx_round(out, (size_t)N * C, ROUND_ACT);
}

// dy[s, :] = w dout[t, :] (overwritten), dw[t*k+j] = dout[t, :] . y[s, :] for s = slot[t*k+j] >= 0,
// dw = 0 for a dropped slot; rows of dy no slot refers to are not touched
static inline void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const int* slot,
                                        const float* w, int N, int k, int C) {
    #pragma omp parallel for
    for (int i = 0; i < N * k; i++) {
        int s = slot[i];
        if (s < 0) { dw[i] = 0.0f; continue; }
        const float* d = dout + (size_t)(i / k) * C;
        const float* ys = y + (size_t)s * C;
        float* dys = dy + (size_t)s * C;
        float wi = w[i], sum = 0.0f;
        for (int c = 0; c < C; c++) {
            sum += d[c] * ys[c];   // read y[s, c] before dy[s, c] is written (dy may be y)
            dys[c] = round_to(cpu_prec.prec, wi * d[c]);   // floatX: stored rounded (--precision)
        }
        dw[i] = sum;
    }
}

// dlogits (N, E) from the gates' gradient dgate (N, k), the probs (N, E), the experts chosen
// idx (N, k) and the auxiliary loss's gradient aux_grad (N / T groups, E) (NULL: none)
static inline void moe_router_backward(float* dlogits, const float* probs, const int* idx, const float* dgate,
                                       const float* aux_grad, int N, int E, int k, int T) {
    #pragma omp parallel
    {
        float* dp = (float*)malloc((size_t)E * sizeof(float));   // one row of d loss / d p
        #pragma omp for
        for (int t = 0; t < N; t++) {
            const float* p = probs + (size_t)t * E;
            const int* ix = idx + (size_t)t * k;
            const float* dg = dgate + (size_t)t * k;
            for (int e = 0; e < E; e++) { dp[e] = 0.0f; }
            if (k == 1) {
                dp[ix[0]] += dg[0];
            } else {
                float S = 0.0f, G = 0.0f;   // S = sum_j p_j, G = sum_j g_j dgate_j
                for (int j = 0; j < k; j++) { S += p[ix[j]]; }
                for (int j = 0; j < k; j++) { G += (p[ix[j]] / S) * dg[j]; }
                for (int j = 0; j < k; j++) { dp[ix[j]] += (dg[j] - G) / S; }
            }
            if (aux_grad) {
                const float* a = aux_grad + (size_t)(t / T) * E;
                for (int e = 0; e < E; e++) { dp[e] += a[e]; }
            }
            float dot = 0.0f;
            for (int e = 0; e < E; e++) { dot += p[e] * dp[e]; }
            float* dz = dlogits + (size_t)t * E;
            for (int e = 0; e < E; e++) { dz[e] = p[e] * (dp[e] - dot); }
        }
        free(dp);
    }
    floatx_round(dlogits, (size_t)N * E, ROUND_GRAD);
}

// x[i] *= s for i < n
static inline void moe_scale(float* x, size_t n, float s) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { x[i] *= s; }
    floatx_round(x, n, ROUND_ACT);
}
