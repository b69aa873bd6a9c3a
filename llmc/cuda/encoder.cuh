// Token + position embedding (formulas in llmc/cpu/encoder.h).
//   forward:  out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]          one thread per output element
//   backward: dwte[tok,:] += sum of dout[b,t,:] over the positions holding tok
//             dwpe[t,:]   += sum_b dout[b,t,:]
// Determinism without atomics: positions that hold the same token would race on the same
// dwte row, so the backward first groups the B*T positions by token on the host (a stable
// counting sort of the token ids, which the host copies back: B*T ints). Then one block per
// distinct token walks its positions in increasing order, a thread per channel, and adds the
// sum into the row once. dwpe: one thread per (t, c) walks b = 0..B-1 in order. The sums are
// fp32 and each gradient element is rounded to floatX once per call.
// Cost: the host sort makes the backward wait for the GPU once per step (small: B*T ints).
#pragma once

#include <vector>
#include "common.cuh"
#include "memory.cuh"   // copy_device_to_host, copy_host_to_device

__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       int B, int T, int C) {
    size_t N = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        out[i] = from_float(to_float(wte[(size_t)inp[bt] * C + c]) + to_float(wpe[(size_t)t * C + c]));
    }
}

static inline void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                   int B, int T, int C) {
    encoder_forward_kernel<<<grid_for((size_t)B * T * C, 256), 256>>>(out, inp, wte, wpe, B, T, C);
    cudaCheckLaunch();
}

// bucket_start[k] .. bucket_start[k+1]-1 index positions[] for distinct token bucket_token[k]
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

__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;   // = t * C + c
    if (i >= (size_t)T * C) { return; }
    float s = 0.0f;
    for (int b = 0; b < B; b++) { s += to_float(dout[(size_t)b * T * C + i]); }
    dwpe[i] = from_float(to_float(dwpe[i]) + s);
}

static inline void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp,
                                    int B, int T, int C) {
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    int BT = B * T;
    // group positions by token on the host: a stable sort keeps each token's positions in order
    std::vector<int> tokens(BT), order(BT);
    copy_device_to_host(tokens.data(), inp, (size_t)BT * sizeof(int));
    int max_tok = 0;
    for (int i = 0; i < BT; i++) { max_tok = tokens[i] > max_tok ? tokens[i] : max_tok; }
    std::vector<int> count(max_tok + 2, 0);
    for (int i = 0; i < BT; i++) { count[tokens[i] + 1]++; }
    for (int v = 0; v <= max_tok; v++) { count[v + 1] += count[v]; }   // count[v] = first slot of token v
    std::vector<int> bucket_start, bucket_token;
    for (int v = 0; v <= max_tok; v++) {
        if (count[v + 1] > count[v]) { bucket_start.push_back(count[v]); bucket_token.push_back(v); }
    }
    bucket_start.push_back(BT);
    for (int i = 0; i < BT; i++) { order[count[tokens[i]]++] = i; }
    int nbuckets = (int)bucket_token.size();
    // one upload: positions | bucket_start | bucket_token
    std::vector<int> packed(order);
    packed.insert(packed.end(), bucket_start.begin(), bucket_start.end());
    packed.insert(packed.end(), bucket_token.begin(), bucket_token.end());
    int* d = (int*)scratch_reserve(&scratch, &scratch_cap, packed.size() * sizeof(int));
    copy_host_to_device(d, packed.data(), packed.size() * sizeof(int));

    const int block = 128;
    dim3 grid(nbuckets, (C + block - 1) / block);
    encoder_backward_wte_kernel<<<grid, block>>>(dwte, dout, d, d + BT, d + BT + nbuckets + 1, C);
    cudaCheckLaunch();
    encoder_backward_wpe_kernel<<<(int)ceil_div((size_t)T * C, 256), 256>>>(dwpe, dout, B, T, C);
    cudaCheckLaunch();
}

// Embedding of N tokens at given positions (generation with a KV cache, llmc/generate.h):
//   out[j,:] = wte[inp[j],:] + wpe[positions[j],:]      one thread per output element
__global__ void encoder_forward_positions_kernel(floatX* out, const int* inp, const int* positions, const floatX* wte,
                                                 const floatX* wpe, int N, int C) {
    size_t total = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t j = i / C;
        int c = (int)(i % C);
        out[i] = from_float(to_float(wte[(size_t)inp[j] * C + c]) + to_float(wpe[(size_t)positions[j] * C + c]));
    }
}

static inline void encoder_forward_positions(floatX* out, const int* inp, const int* positions, const floatX* wte,
                                             const floatX* wpe, int N, int C) {
    encoder_forward_positions_kernel<<<grid_for((size_t)N * C, 256), 256>>>(out, inp, positions, wte, wpe, N, C);
    cudaCheckLaunch();
}
