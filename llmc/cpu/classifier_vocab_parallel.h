// The vocabulary-parallel cross-entropy (llmc/parallel/vocab.h), its CPU kernels: the loss of
// fused_classifier (llmc/cpu/classifier.h) when tensor parallelism splits the logits' columns.
// Each of tp ranks holds the logits of Vs = Vp/tp columns, global columns [v0, v0 + Vs), of
// which those below V are real. The loss never forms a whole row on one rank; three passes with
// a reduction over tp between:
//   1. vocab_row_max:       m_i   = max over the local real columns        (then max over tp)
//   2. vocab_row_sum_target: s_i   = sum of exp(x - m_i) over them, and
//                           x_i,t = the target's logit if this rank holds it, else 0  (then sum over tp)
//   3. vocab_loss_grad:     loss_i = w_i (m_i + log s_i - x_i,t); dlogits as in fused_classifier
// stats holds m (N floats), then (s, x_t) pairs (2N floats).
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format

static inline void vocab_row_max(float* maxes, const float* logits, int N, int Vs, int v0, int V) {
    int real = V - v0 < Vs ? V - v0 : Vs;   // local columns below V (may be <= 0: all padding)
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float* row = logits + (size_t)i * Vs;
        float m = -INFINITY;
        for (int v = 0; v < real; v++) { if (row[v] > m) { m = row[v]; } }
        maxes[i] = m;
    }
}

static inline void vocab_row_sum_target(float* sums, const float* logits, const float* maxes, const int* targets, int N,
                                        int Vs, int v0, int V) {
    int real = V - v0 < Vs ? V - v0 : Vs;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float* row = logits + (size_t)i * Vs;
        float s = 0.0f;
        for (int v = 0; v < real; v++) { s += expf(row[v] - maxes[i]); }
        int t = targets[i] - v0;
        sums[2 * i] = s;
        sums[2 * i + 1] = t >= 0 && t < Vs ? row[t] : 0.0f;
    }
}

static inline void vocab_loss_grad(float* logits, float* losses, const float* weights, const int* targets,
                                   const float* maxes, const float* sums, float dloss, int N, int Vs, int v0, int V,
                                   int write_dlogits) {
    int real = V - v0 < Vs ? V - v0 : Vs;
    if (real < 0) { real = 0; }
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float* row = logits + (size_t)i * Vs;
        float w = weights ? weights[i] : 1.0f;
        float m = maxes[i], sum = sums[2 * i];
        losses[i] = w * (m + logf(sum) - sums[2 * i + 1]);
        if (write_dlogits) {
            float scale = dloss * w, inv = 1.0f / sum;
            int t = targets[i] - v0;
            for (int v = 0; v < real; v++) {
                float p = expf(row[v] - m) * inv;
                row[v] = scale * (p - (v == t ? 1.0f : 0.0f));
            }
            for (int v = real; v < Vs; v++) { row[v] = 0.0f; }
        }
    }
    if (write_dlogits) { floatx_round(logits, (size_t)N * Vs, ROUND_GRAD); }
}
