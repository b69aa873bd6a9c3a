// Causal multi-head self-attention (the "straightforward" version: it materialises the
// T x T attention matrix of every head).
//   inp (B,T,3C) holds q | k | v; head h uses channels h*hs .. (h+1)*hs-1 of each, hs = C/NH.
//   att[b,h,t,t2] = softmax_{t2 <= t}( q_t . k_t2 / sqrt(hs) )     (0 for t2 > t: causal)
//   out[b,t,h*hs + i] = sum_t2 att[b,h,t,t2] * v_t2[i]
// Backward, per head, with P = att, dO = dout:
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(P * dP)),   dQ = dS K / sqrt(hs),   dK = dS^T Q / sqrt(hs)
// dinp is OVERWRITTEN. Threads split over (b, h): each owns its head's slice of dinp,
// so the sums over t into dK and dV need no atomics and are deterministic (dot products: in vector lanes).
#pragma once

#include "round.h"      // floatx_round: outputs stored in the --precision format
#include "exp_poly.h"

// Floats the forward saves per layer for the backward. CPU: the full probability matrix.
static inline size_t attention_state_size(int B, int T, int NH) { return (size_t)B * NH * T * T; }

// One query against the keys/values at positions 0..t (key t2 at k0 + t2*stride, value at
// v0 + t2*stride): p[0..t] = softmax(q . k / sqrt(hs)), o[0..hs) = sum_t2 p[t2] v_t2.
// Shared by the training forward and the KV-cache forward, so the two give the same numbers.
static inline void attend_one_query(float* o, float* p, const float* q, const float* k0, const float* v0,
                                    size_t stride, int t, int hs, float scale) {
    float maxval = -INFINITY;   // scores and running max over the visible keys t2 <= t
    for (int t2 = 0; t2 <= t; t2++) {
        const float* k = k0 + (size_t)t2 * stride;
        float s = 0.0f;
        #pragma omp simd reduction(+ : s)
        for (int i = 0; i < hs; i++) { s += q[i] * k[i]; }
        s *= scale;
        p[t2] = s;
        if (s > maxval) { maxval = s; }
    }
    float sum = 0.0f;
    #pragma omp simd reduction(+ : sum)
    for (int t2 = 0; t2 <= t; t2++) { p[t2] = exp_poly(p[t2] - maxval); sum += p[t2]; }
    float inv = 1.0f / sum;
    for (int t2 = 0; t2 <= t; t2++) { p[t2] *= inv; }
    for (int i = 0; i < hs; i++) { o[i] = 0.0f; }   // weighted sum of the values
    for (int t2 = 0; t2 <= t; t2++) {
        const float* v = v0 + (size_t)t2 * stride;
        for (int i = 0; i < hs; i++) { o[i] += p[t2] * v[i]; }
    }
}

static inline void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH) {
    PROFILE_OP("attention", OP_FWD, cost_attention_forward(B, T, C, (double)attention_state_size(B, T, NH)));
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float* q = inp + ((size_t)b * T + t) * C3 + h * hs;
                float* p = att + (((size_t)b * NH + h) * T + t) * T;
                const float* k0 = inp + (size_t)b * T * C3 + C + h * hs;
                attend_one_query(out + ((size_t)b * T + t) * C + h * hs, p, q, k0, k0 + C, C3, t, hs, scale);
                for (int t2 = t + 1; t2 < T; t2++) { p[t2] = 0.0f; }   // causal: the future gets 0
            }
        }
    }
    floatx_round(out, (size_t)B * T * C, ROUND_ACT);   // the state P stays fp32, as on the GPU
}

static inline void attention_backward(float* dinp, const float* dout, const float* inp, const float* att,
                               int B, int T, int C, int NH) {
    PROFILE_OP("attention", OP_BWD, cost_attention_backward(B, T, C, (double)attention_state_size(B, T, NH)));
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* dp = (float*)malloc((size_t)T * sizeof(float));   // one row of dP, then dS
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < T; t++) {        // clear this head's dq, dk, dv
                    float* d = dinp + ((size_t)b * T + t) * C3 + h * hs;
                    for (int i = 0; i < hs; i++) { d[i] = 0.0f; d[C + i] = 0.0f; d[2 * C + i] = 0.0f; }
                }
                for (int t = 0; t < T; t++) {
                    const float* p = att + (((size_t)b * NH + h) * T + t) * T;
                    const float* dO = dout + ((size_t)b * T + t) * C + h * hs;
                    const float* q = inp + ((size_t)b * T + t) * C3 + h * hs;
                    float* dq = dinp + ((size_t)b * T + t) * C3 + h * hs;
                    // dP[t2] = dO . v_t2  and  dV_t2 += P[t2] * dO
                    float rowdot = 0.0f;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float* v = inp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                        float* dv = dinp + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                        float s = 0.0f;
                        #pragma omp simd reduction(+ : s)
                        for (int i = 0; i < hs; i++) { s += dO[i] * v[i]; dv[i] += p[t2] * dO[i]; }
                        dp[t2] = s;
                        rowdot += p[t2] * s;
                    }
                    // softmax backward, then dQ and dK through the scores q.k * scale
                    for (int t2 = 0; t2 <= t; t2++) {
                        float ds = p[t2] * (dp[t2] - rowdot) * scale;
                        const float* k = inp + ((size_t)b * T + t2) * C3 + C + h * hs;
                        float* dk = dinp + ((size_t)b * T + t2) * C3 + C + h * hs;
                        for (int i = 0; i < hs; i++) { dq[i] += ds * k[i]; dk[i] += ds * q[i]; }
                    }
                }
            }
        }
        free(dp);
    }
    floatx_round(dinp, (size_t)B * T * 3 * C, ROUND_GRAD);
}
