// Causal multi-head attention, flash on CUDA cores: the fp32 build's kernels, and the bf16
// build's where the tensor-core ones (attention_flash_tc.cuh) do not apply (head size 128,
// unaligned tensors). Formulas in llmc/cpu/attention.h. inp (B,T,3C) holds q | k | v; head h
// uses channels h*hs .. (h+1)*hs-1 of each; scale = 1/sqrt(hs).
//
// Never forms the T x T matrix: the forward saves only lse = logsumexp of each row's scaled
// scores (B*NH*T floats = attention_state_size), from which P[t][t2] = exp(s[t][t2] - lse[t]) is
// recomputed exactly.
// Forward: a block of 64 threads owns 64 query rows of one (b, h), one thread per row; keys and
// values stream through shared memory 32 at a time and each thread keeps the online-softmax
// state (running max m, sum l, unnormalised output o[hs] in registers): when a new score s
// exceeds m, l and o are rescaled by exp(m - s).
// Backward, three kernels, none with atomics:
//   a) D[t] = dO[t] . O[t] (= rowsum(P * dP)), by re-running the forward (the signature gives
//      us no O), in fp32;
//   b) dK, dV: a block owns 64 keys (a thread per key, dk and dv in registers) and streams the
//      queries t >= key through shared memory: dv += P dO,  dS = P (dO.v - D),  dk += dS q scale;
//   c) dQ: a block owns 64 queries and streams the keys t2 <= t: dq += dS k scale.
// Each sum is one thread's, in a fixed order: deterministic. dinp is OVERWRITTEN.
// All of its math is fp32 on CUDA cores. Head sizes 16, 32, 64 and 128.
#pragma once

#include "common.cuh"

#define FA_ROWS 64   // query rows (forward, dQ) or keys (dK dV) a block owns: one per thread
#define FA_TILE 32   // keys (forward, dQ) or queries (dK dV) per shared-memory tile

static inline size_t attention_state_size(int B, int T, int NH) { return (size_t)B * NH * T; }

// Loads rows [r0, r0 + nrows) of one head's q, k or v (which = 0, 1, 2) into s (row stride ld),
// times mult, zero past T. All threads of the block take part.
template <int HS>
__device__ void load_head_rows(float* s, int ld, const floatX* inp, int b, int h, int r0, int nrows, int which,
                               float mult, int T, int C) {
    for (int idx = threadIdx.x; idx < nrows * HS; idx += blockDim.x) {
        int r = idx / HS, i = idx % HS, t = r0 + r;
        s[r * ld + i] = t < T ? to_float(inp[((size_t)b * T + t) * 3 * C + which * C + h * HS + i]) * mult : 0.0f;
    }
}

// The forward; with DELTA it instead writes delta[t] = dO[t] . O[t] for the backward.
// grid (ceil(T / FA_ROWS), B * NH), FA_ROWS threads. Scores use q pre-multiplied by scale.
template <int HS, bool DELTA>
__global__ void __launch_bounds__(FA_ROWS) attention_flash_forward_kernel(floatX* out, float* lse, float* delta,
        const floatX* dout, const floatX* inp, int T, int C, int NH) {
    extern __shared__ float smem[];
    float* Qs = smem;                           // FA_ROWS x (HS + 1): own rows, padded (no bank conflicts)
    float* Ks = Qs + FA_ROWS * (HS + 1);        // FA_TILE x HS: read by all threads alike (broadcast)
    float* Vs = Ks + FA_TILE * HS;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int t0 = blockIdx.x * FA_ROWS, t = t0 + threadIdx.x;
    float scale = rsqrtf((float)HS);
    load_head_rows<HS>(Qs, HS + 1, inp, b, h, t0, FA_ROWS, 0, scale, T, C);
    const float* q = Qs + threadIdx.x * (HS + 1);
    float o[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) { o[i] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    int last_key = min(t0 + FA_ROWS, T) - 1;
    for (int k0 = 0; k0 <= last_key; k0 += FA_TILE) {
        __syncthreads();   // the previous tile is no longer read (and, the first time, Qs is loaded)
        load_head_rows<HS>(Ks, HS, inp, b, h, k0, FA_TILE, 1, 1.0f, T, C);
        load_head_rows<HS>(Vs, HS, inp, b, h, k0, FA_TILE, 2, 1.0f, T, C);
        __syncthreads();
        int jmax = t < T ? min(FA_TILE - 1, t - k0) : -1;   // causal: keys k0 + j <= t
        for (int j = 0; j <= jmax; j++) {
            const float* k = Ks + j * HS;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) { s += q[i] * k[i]; }
            if (s > m) {   // new running max: rescale what was summed so far (exp(-inf) = 0 the first time)
                float corr = expf(m - s);
                l *= corr;
#pragma unroll
                for (int i = 0; i < HS; i++) { o[i] *= corr; }
                m = s;
            }
            float p = expf(s - m);
            l += p;
            const float* v = Vs + j * HS;
#pragma unroll
            for (int i = 0; i < HS; i++) { o[i] += p * v[i]; }
        }
    }
    if (t >= T) { return; }
    float inv = 1.0f / l;
    size_t row = (size_t)blockIdx.y * T + t;   // (b * NH + h) * T + t
    if (DELTA) {
        const floatX* dO = dout + ((size_t)b * T + t) * C + h * HS;
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < HS; i++) { d += to_float(dO[i]) * o[i] * inv; }
        delta[row] = d;
    } else {
        floatX* y = out + ((size_t)b * T + t) * C + h * HS;
#pragma unroll
        for (int i = 0; i < HS; i++) { y[i] = from_float(o[i] * inv); }
        lse[row] = m + logf(l);
    }
}

// dK and dV: grid (ceil(T / FA_ROWS), B * NH), a thread per key t2
template <int HS>
__global__ void __launch_bounds__(FA_ROWS) attention_flash_dkdv_kernel(floatX* dinp, const floatX* dout,
        const floatX* inp, const float* lse, const float* delta, int T, int C, int NH) {
    extern __shared__ float smem[];
    float* Ks = smem;                           // FA_ROWS x (HS + 1): own keys
    float* Vs = Ks + FA_ROWS * (HS + 1);        // FA_ROWS x (HS + 1): own values
    float* Qs = Vs + FA_ROWS * (HS + 1);        // FA_TILE x HS queries (times scale)
    float* dOs = Qs + FA_TILE * HS;             // FA_TILE x HS
    float* lse_s = dOs + FA_TILE * HS;          // FA_TILE
    float* delta_s = lse_s + FA_TILE;           // FA_TILE
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int k0 = blockIdx.x * FA_ROWS, t2 = k0 + threadIdx.x;
    float scale = rsqrtf((float)HS);
    load_head_rows<HS>(Ks, HS + 1, inp, b, h, k0, FA_ROWS, 1, 1.0f, T, C);
    load_head_rows<HS>(Vs, HS + 1, inp, b, h, k0, FA_ROWS, 2, 1.0f, T, C);
    const float* k = Ks + threadIdx.x * (HS + 1);
    const float* v = Vs + threadIdx.x * (HS + 1);
    float dk[HS], dv[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) { dk[i] = 0.0f; dv[i] = 0.0f; }
    for (int q0 = k0; q0 < T; q0 += FA_TILE) {   // causal: queries before k0 see none of these keys
        __syncthreads();
        load_head_rows<HS>(Qs, HS, inp, b, h, q0, FA_TILE, 0, scale, T, C);
        for (int idx = threadIdx.x; idx < FA_TILE * HS; idx += blockDim.x) {
            int r = idx / HS, i = idx % HS, tq = q0 + r;
            dOs[idx] = tq < T ? to_float(dout[((size_t)b * T + tq) * C + h * HS + i]) : 0.0f;
        }
        for (int r = threadIdx.x; r < FA_TILE; r += blockDim.x) {
            int tq = q0 + r;
            lse_s[r] = tq < T ? lse[(size_t)blockIdx.y * T + tq] : 0.0f;
            delta_s[r] = tq < T ? delta[(size_t)blockIdx.y * T + tq] : 0.0f;
        }
        __syncthreads();
        if (t2 >= T) { continue; }
        int rmax = min(FA_TILE, T - q0);
        for (int r = max(0, t2 - q0); r < rmax; r++) {   // queries tq = q0 + r >= t2
            const float* q = Qs + r * HS;
            const float* dO = dOs + r * HS;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) { s += q[i] * k[i]; dp += dO[i] * v[i]; }
            float p = expf(s - lse_s[r]);
            float ds = p * (dp - delta_s[r]);
#pragma unroll
            for (int i = 0; i < HS; i++) { dv[i] += p * dO[i]; dk[i] += ds * q[i]; }   // q already has the scale
        }
    }
    if (t2 >= T) { return; }
    floatX* d = dinp + ((size_t)b * T + t2) * 3 * C + h * HS;
#pragma unroll
    for (int i = 0; i < HS; i++) { d[C + i] = from_float(dk[i]); d[2 * C + i] = from_float(dv[i]); }
}

// dQ: grid (ceil(T / FA_ROWS), B * NH), a thread per query t
template <int HS>
__global__ void __launch_bounds__(FA_ROWS) attention_flash_dq_kernel(floatX* dinp, const floatX* dout,
        const floatX* inp, const float* lse, const float* delta, int T, int C, int NH) {
    extern __shared__ float smem[];
    float* Qs = smem;                           // FA_ROWS x (HS + 1): own queries (times scale)
    float* dOs = Qs + FA_ROWS * (HS + 1);       // FA_ROWS x (HS + 1)
    float* Ks = dOs + FA_ROWS * (HS + 1);       // FA_TILE x HS
    float* Vs = Ks + FA_TILE * HS;              // FA_TILE x HS
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int t0 = blockIdx.x * FA_ROWS, t = t0 + threadIdx.x;
    float scale = rsqrtf((float)HS);
    load_head_rows<HS>(Qs, HS + 1, inp, b, h, t0, FA_ROWS, 0, scale, T, C);
    for (int idx = threadIdx.x; idx < FA_ROWS * HS; idx += blockDim.x) {
        int r = idx / HS, i = idx % HS, tq = t0 + r;
        dOs[r * (HS + 1) + i] = tq < T ? to_float(dout[((size_t)b * T + tq) * C + h * HS + i]) : 0.0f;
    }
    const float* q = Qs + threadIdx.x * (HS + 1);
    const float* dO = dOs + threadIdx.x * (HS + 1);
    float my_lse = t < T ? lse[(size_t)blockIdx.y * T + t] : 0.0f;
    float my_delta = t < T ? delta[(size_t)blockIdx.y * T + t] : 0.0f;
    float dq[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) { dq[i] = 0.0f; }
    int last_key = min(t0 + FA_ROWS, T) - 1;
    for (int k0 = 0; k0 <= last_key; k0 += FA_TILE) {
        __syncthreads();
        load_head_rows<HS>(Ks, HS, inp, b, h, k0, FA_TILE, 1, 1.0f, T, C);
        load_head_rows<HS>(Vs, HS, inp, b, h, k0, FA_TILE, 2, 1.0f, T, C);
        __syncthreads();
        int jmax = t < T ? min(FA_TILE - 1, t - k0) : -1;
        for (int j = 0; j <= jmax; j++) {
            const float* k = Ks + j * HS;
            const float* v = Vs + j * HS;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) { s += q[i] * k[i]; dp += dO[i] * v[i]; }
            float ds = expf(s - my_lse) * (dp - my_delta);
#pragma unroll
            for (int i = 0; i < HS; i++) { dq[i] += ds * k[i]; }
        }
    }
    if (t >= T) { return; }
    floatX* d = dinp + ((size_t)b * T + t) * 3 * C + h * HS;
#pragma unroll
    for (int i = 0; i < HS; i++) { d[i] = from_float(dq[i] * scale); }
}

template <int HS>
static void attention_flash_launch_forward(floatX* out, float* lse, float* delta, const floatX* dout,
                                           const floatX* inp, int B, int T, int C, int NH, bool want_delta) {
    dim3 grid((unsigned)ceil_div(T, FA_ROWS), B * NH);
    int smem = (int)((FA_ROWS * (HS + 1) + 2 * FA_TILE * HS) * sizeof(float));
    if (want_delta) {
        cudaCheck(cudaFuncSetAttribute(attention_flash_forward_kernel<HS, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attention_flash_forward_kernel<HS, true><<<grid, FA_ROWS, smem>>>(out, lse, delta, dout, inp, T, C, NH);
    } else {
        cudaCheck(cudaFuncSetAttribute(attention_flash_forward_kernel<HS, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attention_flash_forward_kernel<HS, false><<<grid, FA_ROWS, smem>>>(out, lse, delta, dout, inp, T, C, NH);
    }
    cudaCheckLaunch();
}

template <int HS>
static void attention_flash_launch_backward(floatX* dinp, const floatX* dout, const floatX* inp, const float* lse,
                                            float* delta, int B, int T, int C, int NH) {
    attention_flash_launch_forward<HS>(NULL, NULL, delta, dout, inp, B, T, C, NH, true);
    dim3 grid((unsigned)ceil_div(T, FA_ROWS), B * NH);
    int smem_kv = (int)((2 * FA_ROWS * (HS + 1) + 2 * FA_TILE * HS + 2 * FA_TILE) * sizeof(float));
    cudaCheck(cudaFuncSetAttribute(attention_flash_dkdv_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kv));
    attention_flash_dkdv_kernel<HS><<<grid, FA_ROWS, smem_kv>>>(dinp, dout, inp, lse, delta, T, C, NH);
    cudaCheckLaunch();
    int smem_q = (int)((2 * FA_ROWS * (HS + 1) + 2 * FA_TILE * HS) * sizeof(float));
    cudaCheck(cudaFuncSetAttribute(attention_flash_dq_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_q));
    attention_flash_dq_kernel<HS><<<grid, FA_ROWS, smem_q>>>(dinp, dout, inp, lse, delta, T, C, NH);
    cudaCheckLaunch();
}

static inline void attention_check_head_size(int C, int NH) {
    int hs = C / NH;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
        die("the fused attention kernels support head sizes 16, 32, 64 and 128; this model has C %d / NH %d = %d",
            C, NH, hs);
    }
}

// out (B,T,C); lse (B,NH,T) = attention_state_size floats
static inline void attention_forward_flash(floatX* out, float* lse, const floatX* inp, int B, int T, int C, int NH) {
    attention_check_head_size(C, NH);
    switch (C / NH) {
        case 16: attention_flash_launch_forward<16>(out, lse, NULL, NULL, inp, B, T, C, NH, false); break;
        case 32: attention_flash_launch_forward<32>(out, lse, NULL, NULL, inp, B, T, C, NH, false); break;
        case 64: attention_flash_launch_forward<64>(out, lse, NULL, NULL, inp, B, T, C, NH, false); break;
        default: attention_flash_launch_forward<128>(out, lse, NULL, NULL, inp, B, T, C, NH, false); break;
    }
}

static inline void attention_backward_flash(floatX* dinp, const floatX* dout, const floatX* inp, const float* lse,
                                            int B, int T, int C, int NH) {
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    attention_check_head_size(C, NH);
    float* delta = (float*)scratch_reserve(&scratch, &scratch_cap, attention_state_size(B, T, NH) * sizeof(float));
    switch (C / NH) {
        case 16: attention_flash_launch_backward<16>(dinp, dout, inp, lse, delta, B, T, C, NH); break;
        case 32: attention_flash_launch_backward<32>(dinp, dout, inp, lse, delta, B, T, C, NH); break;
        case 64: attention_flash_launch_backward<64>(dinp, dout, inp, lse, delta, B, T, C, NH); break;
        default: attention_flash_launch_backward<128>(dinp, dout, inp, lse, delta, B, T, C, NH); break;
    }
}
