// Fused softmax + cross-entropy + logit gradient over the V real classes (formulas and the
// loss weights in llmc/cpu/classifier.h). One block per row (b, t), fp32 math:
//   pass 1: each thread keeps an online (max, sum of exp) over its strided columns; the block
//           combines them in a fixed tree (deterministic): logsumexp, then the row's loss;
//   pass 2 (write_dlogits): dlogit = dloss * w * (softmax - onehot), written over the logits
//           in place; the padded columns V..Vp-1 get 0.
// The logits are read twice (once per pass) and the probabilities never stored.
#pragma once

#include "common.cuh"

#define CLASSIFIER_BLOCK 512

__global__ void __launch_bounds__(CLASSIFIER_BLOCK) fused_classifier_kernel(floatX* logits, float* losses,
        const float* weights, const int* targets, float dloss, int V, int Vp, int write_dlogits) {
    __shared__ float s_max[CLASSIFIER_BLOCK / 32], s_sum[CLASSIFIER_BLOCK / 32];
    __shared__ float s_target;
    size_t row = blockIdx.x;
    floatX* x = logits + row * Vp;
    int target = targets[row];
    // pass 1: online max and sum over this thread's columns
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float xv = to_float(x[v]);
        if (xv > m) { s *= expf(m - xv); m = xv; }
        s += expf(xv - m);
    }
    if (threadIdx.x == 0) { s_target = to_float(x[target]); }   // read before pass 2 overwrites it
    // combine (m, s) pairs: first within each warp, then across warps
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
        float mm = fmaxf(m, m2);
        s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
        m = mm;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) { s_max[warp] = m; s_sum[warp] = s; }
    __syncthreads();
    float row_max = -INFINITY;
    for (int w = 0; w < (int)blockDim.x / 32; w++) { row_max = fmaxf(row_max, s_max[w]); }
    float row_sum = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) {
        if (s_max[w] != -INFINITY) { row_sum += s_sum[w] * expf(s_max[w] - row_max); }
    }
    float lse = row_max + logf(row_sum);
    float w = weights ? weights[row] : 1.0f;
    if (threadIdx.x == 0) { losses[row] = w * (lse - s_target); }
    if (!write_dlogits) { return; }
    float scale = dloss * w;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float d = 0.0f;
        if (v < V) { d = scale * (expf(to_float(x[v]) - lse) - (v == target ? 1.0f : 0.0f)); }
        x[v] = from_float(d);
    }
}

static inline void fused_classifier(floatX* logits, float* losses, const float* weights, const int* targets,
                                    float dloss, int B, int T, int V, int Vp, int write_dlogits) {
    fused_classifier_kernel<<<B * T, CLASSIFIER_BLOCK>>>(logits, losses, weights, targets, dloss, V, Vp, write_dlogits);
    cudaCheckLaunch();
}
