// Choosing the next token from logits: greedy (argmax) or top-k sampling with a temperature.
// Works on host copies of one row of logits (gpt2_logits_to_host), over the V real tokens.
#pragma once

#include <vector>
#include <algorithm>
#include "../rand.h"

static inline int sample_argmax(const float* logits, int V) {
    int best = 0;
    for (int v = 1; v < V; v++) { if (logits[v] > logits[best]) { best = v; } }
    return best;
}

// Keep the top_k largest logits (top_k <= 0: all), softmax(logits / temperature) over them,
// draw one. temperature <= 0 means greedy.
static inline int sample_top_k(const float* logits, int V, int top_k, float temperature, Rng* rng) {
    if (temperature <= 0.0f || top_k == 1) { return sample_argmax(logits, V); }
    std::vector<int> idx(V);
    for (int v = 0; v < V; v++) { idx[v] = v; }
    int k = (top_k <= 0 || top_k > V) ? V : top_k;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
    float maxval = logits[idx[0]];
    std::vector<float> p(k);
    float sum = 0.0f;
    for (int i = 0; i < k; i++) { p[i] = expf((logits[idx[i]] - maxval) / temperature); sum += p[i]; }
    float r = rng_uniform(rng) * sum, acc = 0.0f;
    for (int i = 0; i < k; i++) {
        acc += p[i];
        if (r < acc) { return idx[i]; }
    }
    return idx[k - 1];
}
