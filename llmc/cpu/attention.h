// Causal multi-head self-attention (the "straightforward" version: it materialises the
// T x T attention matrix of every head).
//   inp (B,T,3C) holds q | k | v; head h uses channels h*hs .. (h+1)*hs-1 of each, hs = C/NH.
//   att[b,h,t,t2] = softmax_{t2 <= t}( q_t . k_t2 / sqrt(hs) )     (0 for t2 > t: causal)
//   out[b,t,h*hs + i] = sum_t2 att[b,h,t,t2] * v_t2[i]
// Backward, per head, with P = att, dO = dout:
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(P * dP)),   dQ = dS K / sqrt(hs),   dK = dS^T Q / sqrt(hs)
// Per head, with the head's rows as T x hs matrices Q, K, V, dO, every product is one of three
// (llmc/cpu/attention_kernel.h, the performance part: blocks of the result kept in registers):
//   att_lower_abt: the lower triangle of A B^T (S, dP);  att_lower_mul: L X (O, dQ);  att_lower_tmul: L^T X (dV, dK)
// with L = P or dS lower triangular. dinp is OVERWRITTEN. Threads split over (b, h): each owns its
// head's slices of out and dinp, and every sum has an order fixed by the shapes (attention_kernel.h),
// so no atomics, and the same numbers for any thread count.
#pragma once

#include "round.h"      // floatx_round: outputs stored in the --precision format
#include "attention_kernel.h"

// Floats the forward saves per layer for the backward. CPU: the full probability matrix.
static inline size_t attention_state_size(int B, int T, int NH) { return (size_t)B * NH * T * T; }

// Queries t0 .. t0+nq-1 of one head (query r at q + r*ldq) against the keys and values at
// positions 0..t0+r (kt: the keys transposed, kt[i*ldkt + t2] = k_t2[i]; v_t2 at v + t2*ldv):
//   p[r*ldp + t2] = softmax_{t2 <= t0+r}(q_r . k_t2 * scale),   o[r*ldo + i] = sum_{t2 <= t0+r} p[r*ldp + t2] v_t2[i]
// (p and kt: rows of att_padded(t0 + nq) floats, whole blocks are written.) Shared by the training
// forward (all T queries) and the KV-cache forward (one query at a time): a query's numbers do not
// depend on the other queries (attention_kernel.h), so the two give the same numbers.
static inline void attend_queries(float* o, size_t ldo, float* p, size_t ldp, const float* q, size_t ldq,
                                  const float* kt, int ldkt, const float* v, size_t ldv, int t0, int nq, int hs, float scale) {
    att_lower_abt(p, ldp, q, ldq, kt, ldkt, t0, nq, hs, scale);              // the scores
    for (int r = 0; r < nq; r++) { att_softmax(p + r * ldp, t0 + r + 1); }   // row r: over t2 <= t0 + r
    att_lower_mul(o, ldo, p, ldp, v, ldv, t0, nq, hs);                       // the weighted sums of the values
}

static inline void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH) {
    PROFILE_OP("attention", OP_FWD, cost_attention_forward(B, T, C, (double)attention_state_size(B, T, NH)));
    int hs = C / NH, C3 = 3 * C, ld = att_padded(T);
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* kt = (float*)calloc(((size_t)hs + T) * ld, sizeof(float));   // this head's keys, transposed
        float* p = kt + (size_t)hs * ld;                                     // its P, rows padded
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q = inp + (size_t)b * T * C3 + h * hs;   // q_t at q + t*C3, k_t and v_t C and 2C further
                float* att_bh = att + ((size_t)b * NH + h) * T * T;
                att_touch(q, C, 3 * T, hs);   // this head's q, k, v rows: 3T rows of hs floats, C apart
                att_transpose(kt, ld, q + C, C3, T, hs);
                attend_queries(out + (size_t)b * T * C + h * hs, C, p, ld, q, C3, kt, ld, q + 2 * C, C3, 0, T, hs, scale);
                for (int t = 0; t < T; t++) {   // the state P; causal: the future gets 0
                    for (int t2 = 0; t2 < T; t2++) {
                        float pt = p[(size_t)t * ld + t2];
                        att_bh[(size_t)t * T + t2] = t2 <= t ? pt : 0.0f;
                    }
                }
            }
        }
        free(kt);
    }
    floatx_round(out, (size_t)B * T * C, ROUND_ACT);   // the state P stays fp32, as on the GPU
}

static inline void attention_backward(float* dinp, const float* dout, const float* inp, const float* att,
                               int B, int T, int C, int NH) {
    PROFILE_OP("attention", OP_BWD, cost_attention_backward(B, T, C, (double)attention_state_size(B, T, NH)));
    int hs = C / NH, C3 = 3 * C, ld = att_padded(T);
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* vt = (float*)calloc(((size_t)hs + T) * ld, sizeof(float));   // V transposed
        float* ds = vt + (size_t)hs * ld;                                    // dP, then dS, rows padded
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q = inp + (size_t)b * T * C3 + h * hs;   // q_t at q + t*C3, k_t and v_t C and 2C further
                const float* p = att + ((size_t)b * NH + h) * T * T;
                const float* dO = dout + (size_t)b * T * C + h * hs;
                float* dq = dinp + (size_t)b * T * C3 + h * hs;       // dq, dk, dv: the same layout
                att_touch(q, C, 3 * T, hs);   // this head's q, k, v, P and dO rows
                att_touch(p, T, T, T);
                att_touch(dO, C, T, hs);
                att_transpose(vt, ld, q + 2 * C, C3, T, hs);
                att_lower_abt(ds, ld, dO, C, vt, ld, 0, T, hs, 1.0f);   // dP = dO V^T
                for (int t = 0; t < T; t++) {   // softmax backward: dS, with the scale of the scores
                    const float* pt = p + (size_t)t * T;
                    float* dst = ds + (size_t)t * ld;
                    float rowdot = att_dot(pt, dst, t + 1);
                    for (int t2 = 0; t2 <= t; t2++) { dst[t2] = pt[t2] * (dst[t2] - rowdot) * scale; }
                }
                att_lower_tmul(dq + 2 * C, C3, p, T, dO, C, T, hs);   // dV = P^T dO
                att_lower_mul(dq, C3, ds, ld, q + C, C3, 0, T, hs);   // dQ = dS K
                att_lower_tmul(dq + C, C3, ds, ld, q, C3, T, hs);     // dK = dS^T Q
            }
        }
        free(vt);
    }
    floatx_round(dinp, (size_t)B * T * 3 * C, ROUND_GRAD);
}
