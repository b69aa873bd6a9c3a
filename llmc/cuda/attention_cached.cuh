// Causal attention over a KV cache, for generation: the op llmc/model/generate.h installs in
// place of attention for the cached forward (the math is in llmc/cpu/attention.h).
// Token j of the call belongs to cache row r = rows[j] at position p = positions[j];
// kcache, vcache are (rows, maxT, C) for one layer. Two kernels, so that every store is done
// before any token attends (a token reads the keys of the other tokens of its row in the call):
//   a) store: one thread per element, kcache[r, p, c] = k_j[c], vcache[r, p, c] = v_j[c];
//   b) attend: one block per (token j, head h), fp32 math. The block's threads split the keys
//      t2 = 0..p: s[t2] = q . k_t2 / sqrt(hs) into shared memory (maxT floats), then the block
//      max and sum give the softmax, then thread i < hs sums out[i] = sum_t2 P[t2] v_t2[i] in
//      t2 order. No atomics: deterministic. Simple rather than fast (decode is one query).
#pragma once

#include "common.cuh"

__global__ void attention_cache_store_kernel(floatX* kcache, floatX* vcache, const floatX* qkv, const int* rows,
                                             const int* positions, int N, int maxT, int C) {
    size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t j = i / C;
        int c = (int)(i % C);
        size_t slot = ((size_t)rows[j] * maxT + positions[j]) * C + c;
        kcache[slot] = qkv[j * 3 * C + C + c];
        vcache[slot] = qkv[j * 3 * C + 2 * C + c];
    }
}

__global__ void attention_cached_kernel(floatX* out, const floatX* qkv, const floatX* kcache, const floatX* vcache,
                                        const int* rows, const int* positions, int maxT, int C, int NH) {
    extern __shared__ float scores[];   // maxT floats
    __shared__ float reduce[32];
    int j = blockIdx.x, h = blockIdx.y;
    int hs = C / NH, t = positions[j];
    float scale = rsqrtf((float)hs);
    const floatX* q = qkv + (size_t)j * 3 * C + h * hs;
    const floatX* krow = kcache + (size_t)rows[j] * maxT * C + h * hs;
    const floatX* vrow = vcache + (size_t)rows[j] * maxT * C + h * hs;
    float maxval = -INFINITY;
    for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const floatX* k = krow + (size_t)t2 * C;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) { s += to_float(q[i]) * to_float(k[i]); }
        s *= scale;
        scores[t2] = s;
        maxval = fmaxf(maxval, s);
    }
    maxval = block_max(maxval, reduce);
    float sum = 0.0f;
    for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) { float e = expf(scores[t2] - maxval); scores[t2] = e; sum += e; }
    float inv = 1.0f / block_sum(sum, reduce);   // block_sum's barriers also publish scores[]
    for (int i = threadIdx.x; i < hs; i += blockDim.x) {
        float o = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) { o += scores[t2] * to_float(vrow[(size_t)t2 * C + i]); }
        out[(size_t)j * C + h * hs + i] = from_float(o * inv);
    }
}

static inline void attention_forward_cached(floatX* out, const floatX* qkv, floatX* kcache, floatX* vcache,
                                            const int* rows, const int* positions, int N, int maxT, int C, int NH) {
    size_t smem = (size_t)maxT * sizeof(float);
    if (smem > 48 * 1024) { die("attention_forward_cached: maxT %d needs %zu bytes of shared memory (48 KiB at most)", maxT, smem); }
    attention_cache_store_kernel<<<grid_for((size_t)N * C, 256), 256>>>(kcache, vcache, qkv, rows, positions, N, maxT, C);
    cudaCheckLaunch();
    dim3 grid(N, NH);
    attention_cached_kernel<<<grid, 128, smem>>>(out, qkv, kcache, vcache, rows, positions, maxT, C, NH);
    cudaCheckLaunch();
}
