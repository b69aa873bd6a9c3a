// Token + position embedding (formulas in llmc/cpu/encoder.h).
//   forward:  out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]          one thread per output element
//   backward: dwte[tok,:] += sum of dout[b,t,:] over the positions holding tok
//             dwpe[pos,:] += sum_b dout[b,t,:]    pos = t, or positions[t] (llmc/cpu/encoder.h)
// Determinism without atomics: positions that hold the same token would race on the same
// dwte row, so the backward first groups the B*T positions by token on the host (a stable
// counting sort of the token ids, which the host copies back: B*T ints). Then one block per
// distinct token walks its positions in increasing order, a thread per channel, and adds the
// sum into the row once. dwpe: one thread per (t, c) walks b = 0..B-1 in order. The sums are
// fp32 and each gradient element is rounded to floatX once per call.
// Cost: the host sort makes the backward wait for the GPU once per step (small: B*T ints).
#pragma once

#include <limits.h>
#include <vector>
#include "common.cuh"
#include "memory.cuh"   // copy_device_to_host, copy_host_to_device

// The vocabulary-parallel versions (llmc/parallel/vocab.h; formulas in llmc/cpu/encoder.h): wte
// holds rows [v0, v0 + Vs) only, tokens outside the range add 0, wpe (dwpe) may be NULL. The plain
// embedding is v0 = 0 with every token in range.
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const int* positions, const floatX* wte,
                                       const floatX* wpe, int v0, int Vs, int B, int T, int C) {
    size_t N = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), pos = positions ? positions[bt] : (int)(bt % T), row = inp[bt] - v0;
        float e = row >= 0 && row < Vs ? to_float(wte[(size_t)row * C + c]) : 0.0f;
        float p = wpe ? to_float(wpe[(size_t)pos * C + c]) : 0.0f;
        out[i] = from_float(e + p);
    }
}

// positions: NULL (position t of each sequence) or one per token (generation: B = 1, T = N)
static inline void encoder_forward_vocab(floatX* out, const int* inp, const int* positions, const floatX* wte,
                                         const floatX* wpe, int v0, int Vs, int B, int T, int C) {
    PROFILE_OP("encoder", OP_FWD, cost_encoder_forward((double)B * T, C));
    encoder_forward_kernel<<<grid_for((size_t)B * T * C, 256), 256>>>(out, inp, positions, wte, wpe, v0, Vs, B, T, C);
    cudaCheckLaunch();
}
static inline void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C) {
    encoder_forward_vocab(out, inp, NULL, wte, wpe, 0, INT_MAX, B, T, C);
}

// bucket_start[k] .. bucket_start[k+1]-1 index positions[] for distinct token bucket_token[k]
// (bucket_token: the row in this rank's wte)
__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* positions,
                                            const int* bucket_start, const int* bucket_token, int C) {
    int k = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float s = 0.0f;
    for (int j = bucket_start[k]; j < bucket_start[k + 1]; j++) { s += to_float(dout[(size_t)positions[j] * C + c]); }
    floatX* row = dwte + (size_t)bucket_token[k] * C;
    row[c] = from_float(to_float(row[c]) + s);
}

// positions: NULL (t) or the first sequence's positions (all different), as in llmc/cpu/encoder.h
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, const int* positions, int B, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;   // = t * C + c
    if (i >= (size_t)T * C) { return; }
    float s = 0.0f;
    for (int b = 0; b < B; b++) { s += to_float(dout[(size_t)b * T * C + i]); }
    size_t t = i / C, row = positions ? (size_t)positions[t] : t;
    floatX* d = dwpe + row * C + i % C;
    *d = from_float(to_float(*d) + s);
}

static inline void encoder_backward_vocab(floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp,
                                          const int* positions, int v0, int Vs, int B, int T, int C) {
    PROFILE_OP("encoder", OP_BWD, cost_encoder_backward((double)B * T, C));
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    int BT = B * T;
    // group the positions whose token is in range by token on the host: a stable counting sort
    // keeps each token's positions in order
    std::vector<int> tokens(BT), order;
    copy_device_to_host(tokens.data(), inp, (size_t)BT * sizeof(int));
    int max_row = -1;
    for (int i = 0; i < BT; i++) {
        int row = tokens[i] - v0;
        tokens[i] = row >= 0 && row < Vs ? row : -1;   // -1: another rank's row
        max_row = tokens[i] > max_row ? tokens[i] : max_row;
    }
    std::vector<int> count(max_row + 2, 0);
    for (int i = 0; i < BT; i++) { if (tokens[i] >= 0) { count[tokens[i] + 1]++; } }
    for (int v = 0; v <= max_row; v++) { count[v + 1] += count[v]; }   // count[v] = first slot of row v
    int in_range = max_row >= 0 ? count[max_row + 1] : 0;
    std::vector<int> bucket_start, bucket_token;
    for (int v = 0; v <= max_row; v++) {
        if (count[v + 1] > count[v]) { bucket_start.push_back(count[v]); bucket_token.push_back(v); }
    }
    bucket_start.push_back(in_range);
    order.assign(in_range, 0);
    for (int i = 0; i < BT; i++) { if (tokens[i] >= 0) { order[count[tokens[i]]++] = i; } }
    int nbuckets = (int)bucket_token.size();
    if (nbuckets > 0) {
        // one upload: positions | bucket_start | bucket_token
        std::vector<int> packed(order);
        packed.insert(packed.end(), bucket_start.begin(), bucket_start.end());
        packed.insert(packed.end(), bucket_token.begin(), bucket_token.end());
        int* d = (int*)scratch_reserve(&scratch, &scratch_cap, packed.size() * sizeof(int));
        copy_host_to_device(d, packed.data(), packed.size() * sizeof(int));
        const int block = 128;
        dim3 grid(nbuckets, (C + block - 1) / block);
        encoder_backward_wte_kernel<<<grid, block>>>(dwte, dout, d, d + in_range, d + in_range + nbuckets + 1, C);
        cudaCheckLaunch();
    }
    if (dwpe) {
        encoder_backward_wpe_kernel<<<(int)ceil_div((size_t)T * C, 256), 256>>>(dwpe, dout, positions, B, T, C);
        cudaCheckLaunch();
    }
}
static inline void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp, int B, int T, int C) {
    encoder_backward_vocab(dwte, dwpe, dout, inp, NULL, 0, INT_MAX, B, T, C);
}

// Embedding of N tokens at given positions (generation with a KV cache, llmc/model/generate.h):
//   out[j,:] = wte[inp[j],:] + wpe[positions[j],:]
static inline void encoder_forward_positions(floatX* out, const int* inp, const int* positions, const floatX* wte,
                                             const floatX* wpe, int N, int C) {
    encoder_forward_vocab(out, inp, positions, wte, wpe, 0, INT_MAX, 1, N, C);
}
