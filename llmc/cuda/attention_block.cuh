// The pieces of ring attention (context parallelism, llmc/parallel/cp_ring.h) on the GPU: the
// attention of one block of queries against one block of keys at GLOBAL positions, the
// online-softmax merge of partial results, delta = dO . O, the backward of one block pair.
// The math, the row layout (pointer, seq, ld) and the causal rule by position
// (query i at q_pos + i sees key j at k_pos + j iff k_pos + j <= q_pos + i) are in
// llmc/cpu/attention_block.h. q, k, v, dout are floatX; o, lse, delta and the gradients fp32.
//
// All math is fp32 on CUDA cores, laid out like attention_flash.cuh (flash on CUDA cores):
//   forward: grid (ceil(nq / 64), B * NH), a block owns 64 query rows of one (b, h), one thread
//     per row, its q (times scale) in shared memory; keys and values stream through shared
//     memory 32 at a time, and each thread keeps the online-softmax state (running max m,
//     sum l, unnormalised o[hs] in registers): when a new score s exceeds m, l and o are
//     rescaled by exp(m - s). A row that sees no key of the block: lse = -inf, o = 0.
//     Cost: nq nk hs multiply-adds twice per head (less on the diagonal).
//   merge, delta: a thread per (b, i, h), looping over the head's hs channels.
//   backward, two kernels, none with atomics:
//     a) dK, dV: grid (ceil(nk / 64), B * NH), a thread per key (dk, dv in registers)
//        streaming the query rows that see it through shared memory, 32 at a time:
//        P = exp(s - lse), dv += P dO, dS = P (dO . v - delta), dk += dS q scale;
//     b) dQ: grid (ceil(nq / 64), B * NH), a thread per query streaming the keys it sees:
//        dq += dS k scale.
//     Each thread sums its own outputs in a fixed order and adds them (+=) to the fp32
//     gradient once: deterministic.
// Head sizes 16, 32, 64 and 128 (templated: the per-row vectors live in registers).
#pragma once

#include "common.cuh"

#define AB_ROWS 64   // query rows (forward, dQ) or keys (dK dV) a block owns: one per thread
#define AB_TILE 32   // keys (forward, dQ) or query rows (dK dV) per shared-memory tile

// the last key row j of the block that query row i sees (-1 or less: none)
__device__ __forceinline__ int ab_last_key(int i, int nk, int q_pos, int k_pos) {
    long long last = (long long)q_pos + i - k_pos;
    return (int)(last < nk - 1 ? last : nk - 1);
}

// Loads rows [r0, r0 + nrows) of head h of the rows (p, seq, ld) of batch row b into s (row
// stride sld), times mult, zero from row n on. All threads of the block take part.
template <int HS>
__device__ void ab_load_rows(float* s, int sld, const floatX* p, int seq, int ld, int b, int h, int r0, int nrows,
                             int n, float mult) {
    for (int idx = threadIdx.x; idx < nrows * HS; idx += blockDim.x) {
        int r = idx / HS, c = idx % HS, i = r0 + r;
        s[r * sld + c] = i < n ? to_float(p[((size_t)b * seq + i) * ld + h * HS + c]) * mult : 0.0f;
    }
}

// dynamic shared memory above 48 KiB needs an opt-in (HS = 128 does); set it once per kernel
template <typename K>
static inline void ab_prepare(K kernel, int smem, bool* done) {
    if (!*done) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        *done = true;
    }
}

static inline int attention_block_head_size(const char* who, int C, int NH) {
    int hs = NH > 0 ? C / NH : 0;
    if (NH <= 0 || C % NH != 0 || (hs != 16 && hs != 32 && hs != 64 && hs != 128)) {
        die("%s supports head sizes 16, 32, 64 and 128; C %d / NH %d is not one", who, C, NH);
    }
    return hs;
}

// ---------------------------------------------------------------------------------------
// forward: grid (ceil(nq / AB_ROWS), B * NH), AB_ROWS threads

template <int HS>
__global__ void __launch_bounds__(AB_ROWS) attention_block_forward_kernel(float* o, float* lse,
        const floatX* q, int q_seq, int q_ld, const floatX* k, const floatX* v, int kv_seq, int kv_ld,
        int nq, int nk, int C, int NH, int q_pos, int k_pos) {
    extern __shared__ float smem[];
    float* Qs = smem;                           // AB_ROWS x (HS + 1): own rows, padded (no bank conflicts)
    float* Ks = Qs + AB_ROWS * (HS + 1);        // AB_TILE x HS: read by all threads alike (broadcast)
    float* Vs = Ks + AB_TILE * HS;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int i0 = blockIdx.x * AB_ROWS, i = i0 + threadIdx.x;
    float scale = rsqrtf((float)HS);
    ab_load_rows<HS>(Qs, HS + 1, q, q_seq, q_ld, b, h, i0, AB_ROWS, nq, scale);
    const float* qi = Qs + threadIdx.x * (HS + 1);
    float acc[HS];
#pragma unroll
    for (int c = 0; c < HS; c++) { acc[c] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    int my_last = i < nq ? ab_last_key(i, nk, q_pos, k_pos) : -1;
    int block_last = ab_last_key(min(i0 + AB_ROWS, nq) - 1, nk, q_pos, k_pos);   // the block's last row sees most
    for (int k0 = 0; k0 <= block_last; k0 += AB_TILE) {
        __syncthreads();   // the previous tile is no longer read (and, the first time, Qs is loaded)
        ab_load_rows<HS>(Ks, HS, k, kv_seq, kv_ld, b, h, k0, AB_TILE, nk, 1.0f);
        ab_load_rows<HS>(Vs, HS, v, kv_seq, kv_ld, b, h, k0, AB_TILE, nk, 1.0f);
        __syncthreads();
        int jmax = min(AB_TILE - 1, my_last - k0);   // causal: keys k0 + j this row sees
        for (int j = 0; j <= jmax; j++) {
            const float* kj = Ks + j * HS;
            float s = 0.0f;
#pragma unroll
            for (int c = 0; c < HS; c++) { s += qi[c] * kj[c]; }
            if (s > m) {   // new running max: rescale what was summed so far (exp(-inf) = 0 the first time)
                float corr = expf(m - s);
                l *= corr;
#pragma unroll
                for (int c = 0; c < HS; c++) { acc[c] *= corr; }
                m = s;
            }
            float p = expf(s - m);
            l += p;
            const float* vj = Vs + j * HS;
#pragma unroll
            for (int c = 0; c < HS; c++) { acc[c] += p * vj[c]; }
        }
    }
    if (i >= nq) { return; }
    float* oi = o + ((size_t)b * nq + i) * C + h * HS;
    bool seen = my_last >= 0;   // then l >= 1: the largest score contributes exp(0)
    float inv = seen ? 1.0f / l : 0.0f;
#pragma unroll
    for (int c = 0; c < HS; c++) { oi[c] = acc[c] * inv; }
    lse[(size_t)blockIdx.y * nq + i] = seen ? m + logf(l) : -INFINITY;
}

template <int HS>
static void attention_block_launch_forward(float* o, float* lse, const floatX* q, int q_seq, int q_ld,
                                           const floatX* k, const floatX* v, int kv_seq, int kv_ld,
                                           int B, int nq, int nk, int C, int NH, int q_pos, int k_pos) {
    static bool ready = false;
    dim3 grid((unsigned)ceil_div(nq, AB_ROWS), B * NH);
    int smem = (int)((AB_ROWS * (HS + 1) + 2 * AB_TILE * HS) * sizeof(float));
    ab_prepare(attention_block_forward_kernel<HS>, smem, &ready);
    attention_block_forward_kernel<HS><<<grid, AB_ROWS, smem>>>(o, lse, q, q_seq, q_ld, k, v, kv_seq, kv_ld,
                                                                nq, nk, C, NH, q_pos, k_pos);
    cudaCheckLaunch();
}

// o (B, nq, C), lse (B, NH, nq): fp32, contiguous, OVERWRITTEN
static inline void attention_block_forward(float* o, float* lse, const floatX* q, int q_seq, int q_ld,
                                           const floatX* k, const floatX* v, int kv_seq, int kv_ld,
                                           int B, int nq, int nk, int C, int NH, int q_pos, int k_pos) {
    int hs = attention_block_head_size("attention_block_forward", C, NH);
    if (B <= 0 || nq <= 0) { return; }
    switch (hs) {
        case 16: attention_block_launch_forward<16>(o, lse, q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, C, NH, q_pos, k_pos); break;
        case 32: attention_block_launch_forward<32>(o, lse, q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, C, NH, q_pos, k_pos); break;
        case 64: attention_block_launch_forward<64>(o, lse, q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, C, NH, q_pos, k_pos); break;
        default: attention_block_launch_forward<128>(o, lse, q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, C, NH, q_pos, k_pos); break;
    }
}

// ---------------------------------------------------------------------------------------
// merge and delta: a thread per (b, i, h)

__global__ void attention_merge_kernel(float* o_acc, float* lse_acc, int acc_seq, const float* o, const float* lse,
                                       int B, int nq, int C, int NH) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * nq * NH) { return; }
    int h = (int)(idx % NH), i = (int)((idx / NH) % nq), b = (int)(idx / ((size_t)NH * nq));
    int hs = C / NH;
    float* la = lse_acc + ((size_t)b * NH + h) * acc_seq + i;
    float lb = lse[((size_t)b * NH + h) * nq + i];
    float m = fmaxf(*la, lb);
    if (m == -INFINITY) { return; }   // neither side has seen a key yet
    // the max correction: both weights are exp(l - m) <= 1, so neither overflows, and a side
    // that has seen no key (l = -inf) gets weight exactly 0
    float wa = expf(*la - m), wb = expf(lb - m);
    float inv = 1.0f / (wa + wb);
    float* oa = o_acc + ((size_t)b * acc_seq + i) * C + h * hs;
    const float* ob = o + ((size_t)b * nq + i) * C + h * hs;
    for (int c = 0; c < hs; c++) { oa[c] = (wa * oa[c] + wb * ob[c]) * inv; }
    *la = m + logf(wa + wb);
}

// o, lse contiguous ((B, nq, C), (B, NH, nq)) merged into the accumulator rows (o_acc, acc_seq,
// ld C), lse_acc[(b * NH + h) * acc_seq + i] (the caller offsets both to the segment's first row)
static inline void attention_merge(float* o_acc, float* lse_acc, int acc_seq, const float* o, const float* lse,
                                   int B, int nq, int C, int NH) {
    size_t n = (size_t)B * nq * NH;
    if (n == 0) { return; }
    attention_merge_kernel<<<(unsigned)ceil_div(n, 256), 256>>>(o_acc, lse_acc, acc_seq, o, lse, B, nq, C, NH);
    cudaCheckLaunch();
}

__global__ void attention_block_delta_kernel(float* delta, const floatX* dout, const float* o, int B, int n, int C, int NH) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * n * NH) { return; }
    int h = (int)(idx % NH), i = (int)((idx / NH) % n), b = (int)(idx / ((size_t)NH * n));
    int hs = C / NH;
    const floatX* d = dout + ((size_t)b * n + i) * C + h * hs;
    const float* oi = o + ((size_t)b * n + i) * C + h * hs;
    float s = 0.0f;
    for (int c = 0; c < hs; c++) { s += to_float(d[c]) * oi[c]; }
    delta[((size_t)b * NH + h) * n + i] = s;
}

// delta[b, h, i] = dout_i . o_i over head h; dout (B, n, C) floatX, o (B, n, C) fp32, delta (B, NH, n)
static inline void attention_block_delta(float* delta, const floatX* dout, const float* o, int B, int n, int C, int NH) {
    size_t total = (size_t)B * n * NH;
    if (total == 0) { return; }
    attention_block_delta_kernel<<<(unsigned)ceil_div(total, 256), 256>>>(delta, dout, o, B, n, C, NH);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------
// backward

// dK, dV: grid (ceil(nk / AB_ROWS), B * NH), a thread per key j
template <int HS>
__global__ void __launch_bounds__(AB_ROWS) attention_block_dkdv_kernel(float* dk, float* dv, int dkv_seq, int dkv_ld,
        const floatX* dout, int dout_seq, const float* lse, const float* delta, int lse_seq,
        const floatX* q, int q_seq, int q_ld, const floatX* k, const floatX* v, int kv_seq, int kv_ld,
        int nq, int nk, int NH, int q_pos, int k_pos) {
    extern __shared__ float smem[];
    float* Ks = smem;                           // AB_ROWS x (HS + 1): own keys
    float* Vs = Ks + AB_ROWS * (HS + 1);        // AB_ROWS x (HS + 1): own values
    float* Qs = Vs + AB_ROWS * (HS + 1);        // AB_TILE x HS query rows (times scale)
    float* dOs = Qs + AB_TILE * HS;             // AB_TILE x HS
    float* lse_s = dOs + AB_TILE * HS;          // AB_TILE
    float* delta_s = lse_s + AB_TILE;           // AB_TILE
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int j0 = blockIdx.x * AB_ROWS, j = j0 + threadIdx.x;
    float scale = rsqrtf((float)HS);
    ab_load_rows<HS>(Ks, HS + 1, k, kv_seq, kv_ld, b, h, j0, AB_ROWS, nk, 1.0f);
    ab_load_rows<HS>(Vs, HS + 1, v, kv_seq, kv_ld, b, h, j0, AB_ROWS, nk, 1.0f);
    const float* kj = Ks + threadIdx.x * (HS + 1);
    const float* vj = Vs + threadIdx.x * (HS + 1);
    float dkj[HS], dvj[HS];
#pragma unroll
    for (int c = 0; c < HS; c++) { dkj[c] = 0.0f; dvj[c] = 0.0f; }
    // query row i sees key j iff i >= j + k_pos - q_pos: the block's first key is seen first
    long long first = (long long)j0 + k_pos - q_pos;
    int block_first = first > 0 ? (int)(first < nq ? first : nq) : 0;
    long long my_first = (long long)j + k_pos - q_pos;
    const float* lse_row = lse + (size_t)blockIdx.y * lse_seq;       // (b * NH + h) * lse_seq
    const float* delta_row = delta + (size_t)blockIdx.y * lse_seq;
    for (int i0 = block_first; i0 < nq; i0 += AB_TILE) {
        __syncthreads();   // the previous tile is no longer read
        ab_load_rows<HS>(Qs, HS, q, q_seq, q_ld, b, h, i0, AB_TILE, nq, scale);
        ab_load_rows<HS>(dOs, HS, dout, dout_seq, NH * HS, b, h, i0, AB_TILE, nq, 1.0f);
        for (int r = threadIdx.x; r < AB_TILE; r += blockDim.x) {
            int i = i0 + r;
            lse_s[r] = i < nq ? lse_row[i] : 0.0f;
            delta_s[r] = i < nq ? delta_row[i] : 0.0f;
        }
        __syncthreads();
        if (j >= nk) { continue; }
        int rmax = min(AB_TILE, nq - i0);
        long long rfirst = my_first - i0;
        for (int r = rfirst > 0 ? (int)(rfirst < rmax ? rfirst : rmax) : 0; r < rmax; r++) {
            const float* qi = Qs + r * HS;
            const float* dO = dOs + r * HS;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int c = 0; c < HS; c++) { s += qi[c] * kj[c]; dp += dO[c] * vj[c]; }
            float p = expf(s - lse_s[r]);
            float ds = p * (dp - delta_s[r]);
#pragma unroll
            for (int c = 0; c < HS; c++) { dvj[c] += p * dO[c]; dkj[c] += ds * qi[c]; }   // qi already has the scale
        }
    }
    if (j >= nk) { return; }
    float* dkrow = dk + ((size_t)b * dkv_seq + j) * dkv_ld + h * HS;
    float* dvrow = dv + ((size_t)b * dkv_seq + j) * dkv_ld + h * HS;
#pragma unroll
    for (int c = 0; c < HS; c++) { dkrow[c] += dkj[c]; dvrow[c] += dvj[c]; }
}

// dQ: grid (ceil(nq / AB_ROWS), B * NH), a thread per query row i
template <int HS>
__global__ void __launch_bounds__(AB_ROWS) attention_block_dq_kernel(float* dq, int dq_seq,
        const floatX* dout, int dout_seq, const float* lse, const float* delta, int lse_seq,
        const floatX* q, int q_seq, int q_ld, const floatX* k, const floatX* v, int kv_seq, int kv_ld,
        int nq, int nk, int NH, int q_pos, int k_pos) {
    extern __shared__ float smem[];
    float* Qs = smem;                           // AB_ROWS x (HS + 1): own query rows (times scale)
    float* dOs = Qs + AB_ROWS * (HS + 1);       // AB_ROWS x (HS + 1)
    float* Ks = dOs + AB_ROWS * (HS + 1);       // AB_TILE x HS
    float* Vs = Ks + AB_TILE * HS;              // AB_TILE x HS
    int b = blockIdx.y / NH, h = blockIdx.y % NH, C = NH * HS;
    int i0 = blockIdx.x * AB_ROWS, i = i0 + threadIdx.x;
    float scale = rsqrtf((float)HS);
    ab_load_rows<HS>(Qs, HS + 1, q, q_seq, q_ld, b, h, i0, AB_ROWS, nq, scale);
    ab_load_rows<HS>(dOs, HS + 1, dout, dout_seq, C, b, h, i0, AB_ROWS, nq, 1.0f);
    const float* qi = Qs + threadIdx.x * (HS + 1);
    const float* dO = dOs + threadIdx.x * (HS + 1);
    float my_lse = i < nq ? lse[(size_t)blockIdx.y * lse_seq + i] : 0.0f;
    float my_delta = i < nq ? delta[(size_t)blockIdx.y * lse_seq + i] : 0.0f;
    float dqi[HS];
#pragma unroll
    for (int c = 0; c < HS; c++) { dqi[c] = 0.0f; }
    int my_last = i < nq ? ab_last_key(i, nk, q_pos, k_pos) : -1;
    int block_last = ab_last_key(min(i0 + AB_ROWS, nq) - 1, nk, q_pos, k_pos);
    for (int k0 = 0; k0 <= block_last; k0 += AB_TILE) {
        __syncthreads();
        ab_load_rows<HS>(Ks, HS, k, kv_seq, kv_ld, b, h, k0, AB_TILE, nk, 1.0f);
        ab_load_rows<HS>(Vs, HS, v, kv_seq, kv_ld, b, h, k0, AB_TILE, nk, 1.0f);
        __syncthreads();
        int jmax = min(AB_TILE - 1, my_last - k0);
        for (int j = 0; j <= jmax; j++) {
            const float* kj = Ks + j * HS;
            const float* vj = Vs + j * HS;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int c = 0; c < HS; c++) { s += qi[c] * kj[c]; dp += dO[c] * vj[c]; }
            float ds = expf(s - my_lse) * (dp - my_delta);
#pragma unroll
            for (int c = 0; c < HS; c++) { dqi[c] += ds * kj[c]; }
        }
    }
    if (i >= nq) { return; }
    float* dqrow = dq + ((size_t)b * dq_seq + i) * C + h * HS;
#pragma unroll
    for (int c = 0; c < HS; c++) { dqrow[c] += dqi[c] * scale; }
}

template <int HS>
static void attention_block_launch_backward(float* dq, int dq_seq, float* dk, float* dv, int dkv_seq, int dkv_ld,
                                            const floatX* dout, int dout_seq, const float* lse, const float* delta,
                                            int lse_seq, const floatX* q, int q_seq, int q_ld,
                                            const floatX* k, const floatX* v, int kv_seq, int kv_ld,
                                            int B, int nq, int nk, int NH, int q_pos, int k_pos) {
    static bool ready[2] = {false, false};
    dim3 grid_kv((unsigned)ceil_div(nk, AB_ROWS), B * NH);
    int smem_kv = (int)((2 * AB_ROWS * (HS + 1) + 2 * AB_TILE * HS + 2 * AB_TILE) * sizeof(float));
    ab_prepare(attention_block_dkdv_kernel<HS>, smem_kv, &ready[0]);
    attention_block_dkdv_kernel<HS><<<grid_kv, AB_ROWS, smem_kv>>>(dk, dv, dkv_seq, dkv_ld, dout, dout_seq, lse, delta,
                                                                   lse_seq, q, q_seq, q_ld, k, v, kv_seq, kv_ld,
                                                                   nq, nk, NH, q_pos, k_pos);
    cudaCheckLaunch();
    dim3 grid_q((unsigned)ceil_div(nq, AB_ROWS), B * NH);
    int smem_q = (int)((2 * AB_ROWS * (HS + 1) + 2 * AB_TILE * HS) * sizeof(float));
    ab_prepare(attention_block_dq_kernel<HS>, smem_q, &ready[1]);
    attention_block_dq_kernel<HS><<<grid_q, AB_ROWS, smem_q>>>(dq, dq_seq, dout, dout_seq, lse, delta, lse_seq,
                                                               q, q_seq, q_ld, k, v, kv_seq, kv_ld,
                                                               nq, nk, NH, q_pos, k_pos);
    cudaCheckLaunch();
}

// With the FINAL lse and delta of the query rows (at [(b * NH + h) * lse_seq + i]): dq rows
// (dq, dq_seq, ld C), dk and dv rows (dk / dv, dkv_seq, dkv_ld), dout rows (dout, dout_seq, ld C).
// All three gradients (fp32) ACCUMULATE.
static inline void attention_block_backward(float* dq, int dq_seq, float* dk, float* dv, int dkv_seq, int dkv_ld,
                                            const floatX* dout, int dout_seq, const float* lse, const float* delta,
                                            int lse_seq, const floatX* q, int q_seq, int q_ld,
                                            const floatX* k, const floatX* v, int kv_seq, int kv_ld,
                                            int B, int nq, int nk, int C, int NH, int q_pos, int k_pos) {
    int hs = attention_block_head_size("attention_block_backward", C, NH);
    if (B <= 0 || nq <= 0 || nk <= 0) { return; }
    switch (hs) {
        case 16: attention_block_launch_backward<16>(dq, dq_seq, dk, dv, dkv_seq, dkv_ld, dout, dout_seq, lse, delta, lse_seq,
                                                     q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, NH, q_pos, k_pos); break;
        case 32: attention_block_launch_backward<32>(dq, dq_seq, dk, dv, dkv_seq, dkv_ld, dout, dout_seq, lse, delta, lse_seq,
                                                     q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, NH, q_pos, k_pos); break;
        case 64: attention_block_launch_backward<64>(dq, dq_seq, dk, dv, dkv_seq, dkv_ld, dout, dout_seq, lse, delta, lse_seq,
                                                     q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, NH, q_pos, k_pos); break;
        default: attention_block_launch_backward<128>(dq, dq_seq, dk, dv, dkv_seq, dkv_ld, dout, dout_seq, lse, delta, lse_seq,
                                                      q, q_seq, q_ld, k, v, kv_seq, kv_ld, B, nq, nk, NH, q_pos, k_pos); break;
    }
}
