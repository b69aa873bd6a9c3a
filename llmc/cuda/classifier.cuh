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
    PROFILE_OP("classifier", OP_FWD, cost_classifier((double)B * T, V, Vp, weights != NULL, write_dlogits));
    fused_classifier_kernel<<<B * T, CLASSIFIER_BLOCK>>>(logits, losses, weights, targets, dloss, V, Vp, write_dlogits);
    cudaCheckLaunch();
}

// The vocabulary-parallel cross-entropy (llmc/parallel/vocab.h; the three passes and their
// formulas in llmc/cpu/classifier.h). One block per row, each a fixed-order tree reduction
// (deterministic); the statistics are fp32, the logits floatX.
__device__ inline float block_reduce_max_sum(float x, int is_max) {   // every thread gets the result
    __shared__ float part[CLASSIFIER_BLOCK / 32];
    for (int off = 16; off > 0; off >>= 1) {
        float y = __shfl_xor_sync(0xffffffffu, x, off);
        x = is_max ? fmaxf(x, y) : x + y;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();   // part[] may still be read by a previous call
    if (lane == 0) { part[warp] = x; }
    __syncthreads();
    float r = is_max ? -INFINITY : 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) { r = is_max ? fmaxf(r, part[w]) : r + part[w]; }
    return r;
}

__global__ void __launch_bounds__(CLASSIFIER_BLOCK) vocab_row_max_kernel(float* maxes, const floatX* logits, int Vs,
                                                                          int real) {
    const floatX* x = logits + (size_t)blockIdx.x * Vs;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < real; v += blockDim.x) { m = fmaxf(m, to_float(x[v])); }
    m = block_reduce_max_sum(m, 1);
    if (threadIdx.x == 0) { maxes[blockIdx.x] = m; }
}

__global__ void __launch_bounds__(CLASSIFIER_BLOCK) vocab_row_sum_target_kernel(float* sums, const floatX* logits,
        const float* maxes, const int* targets, int Vs, int v0, int real) {
    size_t i = blockIdx.x;
    const floatX* x = logits + i * Vs;
    float m = maxes[i], s = 0.0f;
    for (int v = threadIdx.x; v < real; v += blockDim.x) { s += expf(to_float(x[v]) - m); }
    s = block_reduce_max_sum(s, 0);
    if (threadIdx.x == 0) {
        int t = targets[i] - v0;
        sums[2 * i] = s;
        sums[2 * i + 1] = t >= 0 && t < Vs ? to_float(x[t]) : 0.0f;
    }
}

__global__ void __launch_bounds__(CLASSIFIER_BLOCK) vocab_loss_grad_kernel(floatX* logits, float* losses,
        const float* weights, const int* targets, const float* maxes, const float* sums, float dloss, int Vs, int v0,
        int real, int write_dlogits) {
    size_t i = blockIdx.x;
    floatX* x = logits + i * Vs;
    float w = weights ? weights[i] : 1.0f, m = maxes[i], sum = sums[2 * i];
    if (threadIdx.x == 0) { losses[i] = w * (m + logf(sum) - sums[2 * i + 1]); }
    if (!write_dlogits) { return; }
    float scale = dloss * w, inv = 1.0f / sum;
    int t = targets[i] - v0;
    for (int v = threadIdx.x; v < Vs; v += blockDim.x) {
        float d = v < real ? scale * (expf(to_float(x[v]) - m) * inv - (v == t ? 1.0f : 0.0f)) : 0.0f;
        x[v] = from_float(d);
    }
}

static inline int vocab_real_columns(int Vs, int v0, int V) {
    int real = V - v0 < Vs ? V - v0 : Vs;
    return real > 0 ? real : 0;
}
static inline void vocab_row_max(float* maxes, const floatX* logits, int N, int Vs, int v0, int V) {
    vocab_row_max_kernel<<<N, CLASSIFIER_BLOCK>>>(maxes, logits, Vs, vocab_real_columns(Vs, v0, V));
    cudaCheckLaunch();
}
static inline void vocab_row_sum_target(float* sums, const floatX* logits, const float* maxes, const int* targets, int N,
                                        int Vs, int v0, int V) {
    vocab_row_sum_target_kernel<<<N, CLASSIFIER_BLOCK>>>(sums, logits, maxes, targets, Vs, v0, vocab_real_columns(Vs, v0, V));
    cudaCheckLaunch();
}
static inline void vocab_loss_grad(floatX* logits, float* losses, const float* weights, const int* targets,
                                   const float* maxes, const float* sums, float dloss, int N, int Vs, int v0, int V,
                                   int write_dlogits) {
    vocab_loss_grad_kernel<<<N, CLASSIFIER_BLOCK>>>(logits, losses, weights, targets, maxes, sums, dloss, Vs, v0,
                                                    vocab_real_columns(Vs, v0, V), write_dlogits);
    cudaCheckLaunch();
}
