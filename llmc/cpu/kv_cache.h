// The kernels of generation with a KV cache (llmc/model/generate.h): the N tokens of one call
// are "flattened", token j of cache row r = rows[j] (one sequence) at position p = positions[j].
#pragma once

#include <string.h>
#include "encoder.h"     // encoder_forward_vocab
#include "attention.h"   // attend_queries: the training forward's numbers

// Embedding of the N tokens at their positions:
//   out[j,:] = wte[inp[j],:] + wpe[positions[j],:]     j = 0..N-1
static inline void encoder_forward_positions(float* out, const int* inp, const int* positions, const float* wte,
                                             const float* wpe, int N, int C) {
    encoder_forward_vocab(out, inp, positions, wte, wpe, 0, INT_MAX, 1, N, C);
}

// Attention with a KV cache. kcache, vcache are (rows, maxT, C) for one layer.
//   1. store:  kcache[r, p, :] = k_j,  vcache[r, p, :] = v_j     for every j (all stores first,
//              so a token sees the other tokens of its row in this call, e.g. in a prefill)
//   2. attend: out[j, h*hs + i] = sum_{t2 <= p} softmax_{t2 <= p}( q_j . kcache[r, t2] / sqrt(hs) ) vcache[r, t2, h*hs + i]
// This is attention_forward's row t = p of sequence r, provided positions 0..p of row r are
// in the cache (from this call or earlier ones): the same numbers up to rounding.
static inline void attention_forward_cached(float* out, const float* qkv, float* kcache, float* vcache,
                                            const int* rows, const int* positions, int N, int maxT, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int j = 0; j < N; j++) {
        size_t slot = ((size_t)rows[j] * maxT + positions[j]) * C;
        memcpy(kcache + slot, qkv + (size_t)j * C3 + C, (size_t)C * sizeof(float));
        memcpy(vcache + slot, qkv + (size_t)j * C3 + 2 * C, (size_t)C * sizeof(float));
    }
    #pragma omp parallel
    {
        float* p = (float*)malloc(((size_t)hs + 1) * att_padded(maxT) * sizeof(float));
        float* kt = p + att_padded(maxT);   // p: one row of scores, then probabilities; kt: the keys, transposed
        #pragma omp for collapse(2)
        for (int j = 0; j < N; j++) {
            for (int h = 0; h < NH; h++) {
                int t = positions[j], ldkt = att_padded(t + 1);
                const float* q = qkv + (size_t)j * C3 + h * hs;
                const float* krow = kcache + (size_t)rows[j] * maxT * C + h * hs;
                const float* vrow = vcache + (size_t)rows[j] * maxT * C + h * hs;
                att_transpose(kt, ldkt, krow, C, t + 1, hs);
                attend_queries(out + (size_t)j * C + h * hs, C, p, att_padded(maxT), q, C3, kt, ldkt, vrow, C, t, 1, hs, scale);
            }
        }
        free(p);
    }
}
