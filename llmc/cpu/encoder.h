// Token + position embedding.
//   forward:  out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
//   backward: dwte[inp[b,t],:] += dout[b,t,:]   and   dwpe[t,:] += sum_b dout[b,t,:]
// Two positions can hold the same token, so the dwte scatter-add would race if we split
// positions across threads. Instead each thread owns a block of channels and walks all
// positions in order: no races, and the sum order does not depend on the thread count.
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format
#include <limits.h>
#include <algorithm>
#include <vector>

// The vocabulary-parallel lookup (llmc/parallel/vocab.h): this rank holds rows [v0, v0 + Vs) of
// wte, as wte_shard. Tokens outside the range contribute 0 (another rank holds their row), and
// wpe may be NULL (only one rank of the group adds it, so the sum over ranks adds it once):
//   forward:  out[b,t,:]  = (v0 <= tok < v0 + Vs ? wte_shard[tok - v0,:] : 0) + wpe[pos,:]
//   backward: dwte_shard[tok - v0,:] += dout[b,t,:] for the tokens in range; dwpe as above
// pos is t, or positions[b T + t] when positions is given (generation, llmc/cpu/kv_cache.h;
// context parallelism: this rank's part of each sequence, llmc/parallel/cp.h). The backward
// reads positions[t] (the first sequence's): in training every sequence holds the same
// positions, all different. With v0 = 0 and every token in range these are the plain passes.
static inline void encoder_forward_vocab(float* out, const int* inp, const int* positions, const float* wte,
                                         const float* wpe, int v0, int Vs, int B, int T, int C) {
    PROFILE_OP("encoder", OP_FWD, cost_encoder_forward((double)B * T, C));
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* out_bt = out + ((size_t)b * T + t) * C;
            int row = inp[b * T + t] - v0, pos = positions ? positions[b * T + t] : t;
            const float* wte_ix = row >= 0 && row < Vs ? wte + (size_t)row * C : NULL;
            const float* wpe_t = wpe ? wpe + (size_t)pos * C : NULL;
            for (int c = 0; c < C; c++) { out_bt[c] = (wte_ix ? wte_ix[c] : 0.0f) + (wpe_t ? wpe_t[c] : 0.0f); }
        }
    }
    floatx_round(out, (size_t)B * T * C, ROUND_ACT);
}

static inline void encoder_backward_vocab(float* dwte, float* dwpe, const float* dout, const int* inp,
                                          const int* positions, int v0, int Vs, int B, int T, int C) {
    PROFILE_OP("encoder", OP_BWD, cost_encoder_backward((double)B * T, C));
    const int CB = 16;  // channels per block: one 64-byte cache line of floats
    int nblocks = (C + CB - 1) / CB;
    #pragma omp parallel for
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float* dout_bt = dout + ((size_t)b * T + t) * C;
                int row = inp[b * T + t] - v0;
                if (row >= 0 && row < Vs) {
                    float* dwte_ix = dwte + (size_t)row * C;
                    for (int c = c0; c < c1; c++) { dwte_ix[c] += dout_bt[c]; }
                }
                if (dwpe) {
                    float* dwpe_t = dwpe + (size_t)(positions ? positions[t] : t) * C;
                    for (int c = c0; c < c1; c++) { dwpe_t[c] += dout_bt[c]; }
                }
            }
        }
    }
    if (cpu_prec.prec != PREC_FP32) {   // --precision: each row this pass touched, rounded once
        std::vector<int> rows;
        for (int i = 0; i < B * T; i++) { if (inp[i] - v0 >= 0 && inp[i] - v0 < Vs) { rows.push_back(inp[i] - v0); } }
        std::sort(rows.begin(), rows.end());
        rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
        for (int row : rows) { floatx_round(dwte + (size_t)row * C, C, ROUND_GRAD); }
        if (dwpe) {
            for (int t = 0; t < T; t++) { floatx_round(dwpe + (size_t)(positions ? positions[t] : t) * C, C, ROUND_GRAD); }
        }
    }
}

static inline void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
    encoder_forward_vocab(out, inp, NULL, wte, wpe, 0, INT_MAX, B, T, C);
}
static inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    encoder_backward_vocab(dwte, dwpe, dout, inp, NULL, 0, INT_MAX, B, T, C);
}
