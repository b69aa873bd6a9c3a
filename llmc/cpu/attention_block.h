// Attention of one block of queries against one block of keys, the pieces of ring attention
// (context parallelism, llmc/parallel/cp_ring.h): each rank holds some query rows and sees the keys
// and values one block at a time; it combines the partial results with the online-softmax
// merge, then in the backward revisits the same blocks with the final lse.
//
// Rows: a tensor of B sequences of rows is (pointer p, seq, ld): element (b, i, c) is at
// p[((size_t)b * seq + i) * ld + c]. A block is a range of rows of such a tensor: the caller
// offsets the pointer to its first row. Head h uses channels h*hs .. (h+1)*hs-1, hs = C/NH,
// scale = 1/sqrt(hs). Causal by GLOBAL position: query row i is at position q_pos + i, key row
// j at k_pos + j, and query i sees key j iff k_pos + j <= q_pos + i.
//
//   forward, per (b, h, i) over the visible keys j < nk (none visible: lse = -inf, o = 0):
//     s_j = scale q_i . k_j,   lse_i = log sum_j exp(s_j),   o_i = sum_j exp(s_j - lse_i) v_j
//   merge of a partial (o, lse) into an accumulator (oa, la), per (b, h, i): cp_ring.h's rule;
//     merging the blocks of all the keys, in any order, from (0, -inf) gives full attention.
//   backward, with the FINAL lse and delta_i = dout_i . o_i of the query rows (any block):
//     P_ij = exp(s_ij - lse_i) (0 where not visible),  dP_ij = dout_i . v_j,
//     dS_ij = P_ij (dP_ij - delta_i),
//     dq_i += scale sum_j dS_ij k_j,  dk_j += scale sum_i dS_ij q_i,  dv_j += sum_i P_ij dout_i
//     (ACCUMULATED: the sums over all key blocks, resp. all query blocks, add up to the full
//     gradients of llmc/cpu/attention.h.)
// Cost per (query block, key block) pair: about 2 B NH nq nk hs multiply-adds forward (half
// that when the block is on the diagonal), 5 backward. Memory: the fp32 partial o and lse.
//
// Deterministic: threads split over (b, h) (backward) or (b, h, i) (forward, merge), each owns
// its slices of the outputs and sums them in a fixed order; no atomics. On the CPU floatX is
// float, so every floatX of the shared signatures is written float here (which also lets the
// CUDA test include this file as its reference, inside namespace cpu).
#pragma once

#include <math.h>
#include <stdlib.h>

// the last key row j of the block that query row i sees (-1: none): k_pos + j <= q_pos + i, j < nk
static inline int attention_block_last_key(int i, int nk, int q_pos, int k_pos) {
    long last = (long)q_pos + i - k_pos;
    return (int)(last < nk - 1 ? last : nk - 1);
}

// o (B, nq, C) and lse (B, NH, nq) fp32, contiguous, OVERWRITTEN. v is a separate pointer with
// the rows of k (kv_seq, kv_ld).
static inline void attention_block_forward(float* o, float* lse, const float* q, int q_seq, int q_ld,
                                           const float* k, const float* v, int kv_seq, int kv_ld,
                                           int B, int nq, int nk, int C, int NH, int q_pos, int k_pos) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* p = (float*)malloc((size_t)(nk > 0 ? nk : 1) * sizeof(float));   // one row of scores
        #pragma omp for collapse(3)
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < nq; i++) {
                for (int h = 0; h < NH; h++) {
                    const float* qi = q + ((size_t)b * q_seq + i) * q_ld + h * hs;
                    float* oi = o + ((size_t)b * nq + i) * C + h * hs;
                    float* li = lse + ((size_t)b * NH + h) * nq + i;
                    int last = attention_block_last_key(i, nk, q_pos, k_pos);
                    for (int c = 0; c < hs; c++) { oi[c] = 0.0f; }
                    if (last < 0) { *li = -INFINITY; continue; }   // sees no key of this block
                    float maxval = -INFINITY;
                    for (int j = 0; j <= last; j++) {
                        const float* kj = k + ((size_t)b * kv_seq + j) * kv_ld + h * hs;
                        float s = 0.0f;
                        for (int c = 0; c < hs; c++) { s += qi[c] * kj[c]; }
                        s *= scale;
                        p[j] = s;
                        if (s > maxval) { maxval = s; }
                    }
                    float sum = 0.0f;
                    for (int j = 0; j <= last; j++) { p[j] = expf(p[j] - maxval); sum += p[j]; }
                    float inv = 1.0f / sum;
                    for (int j = 0; j <= last; j++) {
                        const float* vj = v + ((size_t)b * kv_seq + j) * kv_ld + h * hs;
                        float w = p[j] * inv;
                        for (int c = 0; c < hs; c++) { oi[c] += w * vj[c]; }
                    }
                    *li = maxval + logf(sum);
                }
            }
        }
        free(p);
    }
}

// Merges (o, lse) (contiguous: (B, nq, C), (B, NH, nq)) into the accumulator rows (o_acc,
// acc_seq, ld C) and lse_acc[(b * NH + h) * acc_seq + i]; the caller offsets both accumulator
// pointers to the segment's first row.
static inline void attention_merge(float* o_acc, float* lse_acc, int acc_seq, const float* o, const float* lse,
                                   int B, int nq, int C, int NH) {
    int hs = C / NH;
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < nq; i++) {
            for (int h = 0; h < NH; h++) {
                float* la = lse_acc + ((size_t)b * NH + h) * acc_seq + i;
                float lb = lse[((size_t)b * NH + h) * nq + i];
                float m = fmaxf(*la, lb);
                if (m == -INFINITY) { continue; }   // neither side has seen a key yet
                // the max correction: both weights are exp(l - m) <= 1, so neither overflows,
                // and a side that has seen no key (l = -inf) gets weight exactly 0
                float wa = expf(*la - m), wb = expf(lb - m);
                float inv = 1.0f / (wa + wb);
                float* oa = o_acc + ((size_t)b * acc_seq + i) * C + h * hs;
                const float* ob = o + ((size_t)b * nq + i) * C + h * hs;
                for (int c = 0; c < hs; c++) { oa[c] = (wa * oa[c] + wb * ob[c]) * inv; }
                *la = m + logf(wa + wb);
            }
        }
    }
}

// delta[b, h, i] = dout_i . o_i over head h's channels; dout, o (B, n, C) contiguous, delta (B, NH, n)
static inline void attention_block_delta(float* delta, const float* dout, const float* o, int B, int n, int C, int NH) {
    int hs = C / NH;
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < n; i++) {
                const float* d = dout + ((size_t)b * n + i) * C + h * hs;
                const float* oi = o + ((size_t)b * n + i) * C + h * hs;
                float s = 0.0f;
                for (int c = 0; c < hs; c++) { s += d[c] * oi[c]; }
                delta[((size_t)b * NH + h) * n + i] = s;
            }
        }
    }
}

// dq rows (dq, dq_seq, ld C); dk, dv rows (dk / dv, dkv_seq, dkv_ld); dout rows (dout, dout_seq,
// ld C); lse and delta at [(b * NH + h) * lse_seq + i]. All three gradients ACCUMULATE.
static inline void attention_block_backward(float* dq, int dq_seq, float* dk, float* dv, int dkv_seq, int dkv_ld,
                                            const float* dout, int dout_seq, const float* lse, const float* delta,
                                            int lse_seq, const float* q, int q_seq, int q_ld,
                                            const float* k, const float* v, int kv_seq, int kv_ld,
                                            int B, int nq, int nk, int C, int NH, int q_pos, int k_pos) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* dqi = (float*)malloc((size_t)hs * sizeof(float));   // one query's sum over the keys
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {   // this thread owns head h's channels of batch row b
                for (int i = 0; i < nq; i++) {
                    int last = attention_block_last_key(i, nk, q_pos, k_pos);
                    if (last < 0) { continue; }
                    const float* qi = q + ((size_t)b * q_seq + i) * q_ld + h * hs;
                    const float* dO = dout + ((size_t)b * dout_seq + i) * C + h * hs;
                    float l = lse[((size_t)b * NH + h) * lse_seq + i];
                    float D = delta[((size_t)b * NH + h) * lse_seq + i];
                    for (int c = 0; c < hs; c++) { dqi[c] = 0.0f; }
                    for (int j = 0; j <= last; j++) {
                        const float* kj = k + ((size_t)b * kv_seq + j) * kv_ld + h * hs;
                        const float* vj = v + ((size_t)b * kv_seq + j) * kv_ld + h * hs;
                        float* dkj = dk + ((size_t)b * dkv_seq + j) * dkv_ld + h * hs;
                        float* dvj = dv + ((size_t)b * dkv_seq + j) * dkv_ld + h * hs;
                        float s = 0.0f, dp = 0.0f;
                        for (int c = 0; c < hs; c++) { s += qi[c] * kj[c]; dp += dO[c] * vj[c]; }
                        float p = expf(s * scale - l);
                        float ds = p * (dp - D) * scale;
                        for (int c = 0; c < hs; c++) {
                            dqi[c] += ds * kj[c];
                            dkj[c] += ds * qi[c];
                            dvj[c] += p * dO[c];
                        }
                    }
                    float* dqrow = dq + ((size_t)b * dq_seq + i) * C + h * hs;
                    for (int c = 0; c < hs; c++) { dqrow[c] += dqi[c]; }
                }
            }
        }
        free(dqi);
    }
}
