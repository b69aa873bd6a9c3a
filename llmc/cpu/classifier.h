// Fused softmax + cross-entropy (+ its gradient), over the V real classes of each row.
//   loss_i   = w_i * ( logsumexp(logits_i[0:V]) - logits_i[target_i] )
//   dlogit_i = dloss * w_i * ( softmax(logits_i) - onehot(target_i) )   (0 in padded columns)
// w_i is an optional per-token loss weight (NULL = all 1): a 0/1 mask restricts the loss to
// answer tokens (SFT), a signed weight turns it into a policy-gradient loss (RL).
// dloss is the scalar every token's gradient is scaled by: 1 / (number of tokens the loss
// averages over in one optimizer step). When write_dlogits is set the gradient OVERWRITES
// the logits in place: the probabilities are never stored, which saves a B*T*Vp buffer.
#pragma once

#include "round.h"      // floatx_round: outputs stored in the --precision format
#include "exp_poly.h"   // an exp the compiler vectorises; the sum of exps in vector lanes

static inline void fused_classifier(float* logits, float* losses, const float* weights, const int* targets,
                             float dloss, int B, int T, int V, int Vp, int write_dlogits) {
    PROFILE_OP("classifier", OP_FWD, cost_classifier((double)B * T, V, Vp, weights != NULL, write_dlogits));
    int N = B * T;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float* row = logits + (size_t)i * Vp;
        float w = weights ? weights[i] : 1.0f;
        int target = targets[i];
        float maxval = -INFINITY;
        #pragma omp simd reduction(max : maxval)   // in vector lanes (a max is the same in any order)
        for (int v = 0; v < V; v++) { maxval = row[v] > maxval ? row[v] : maxval; }
        float sum = 0.0f;
        #pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) { sum += exp_poly(row[v] - maxval); }
        float logsumexp = maxval + logf(sum);
        losses[i] = w * (logsumexp - row[target]);
        if (write_dlogits) {
            float scale = dloss * w, inv = 1.0f / sum;
            for (int v = 0; v < V; v++) {
                float p = exp_poly(row[v] - maxval) * inv;
                row[v] = scale * (p - (v == target ? 1.0f : 0.0f));
            }
            for (int v = V; v < Vp; v++) { row[v] = 0.0f; }
        }
    }
    if (write_dlogits) { floatx_round(logits, (size_t)N * Vp, ROUND_GRAD); }
}
