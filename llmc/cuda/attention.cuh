// Causal multi-head self-attention (formulas in llmc/cpu/attention.h). inp (B,T,3C) holds
// q | k | v; head h uses channels h*hs .. (h+1)*hs-1 of each; scale = 1/sqrt(hs).
// Four implementations, each callable by name (the kernel lab compares them):
//
// 1. materialized: stores the T x T probabilities P of every head (att: B*NH*T*T floats), as
//    the CPU does. Forward: one warp per query row (scores, softmax, P @ V). Backward: one warp
//    per row computes dS = P * (dP - rowsum(P * dP)) into a scratch T x T buffer; then one
//    thread per output element sums dQ = scale dS K over keys and dK = scale dS^T Q,
//    dV = P^T dO over queries, each in a fixed order.
//
// 2. flash on CUDA cores: never forms the T x T matrix; the forward saves only
//    lse = logsumexp of each row's scaled scores (B*NH*T floats = attention_state_size), from
//    which P[t][t2] = exp(s[t][t2] - lse[t]) is recomputed exactly.
//    Forward: a block of 64 threads owns 64 query rows of one (b, h), one thread per row;
//    keys and values stream through shared memory 32 at a time and each thread keeps the
//    online-softmax state (running max m, sum l, unnormalised output o[hs] in registers):
//    when a new score s exceeds m, l and o are rescaled by exp(m - s).
//    Backward, three kernels, none with atomics:
//      a) D[t] = dO[t] . O[t] (= rowsum(P * dP)), by re-running the forward (the signature
//         gives us no O), in fp32;
//      b) dK, dV: a block owns 64 keys (a thread per key, dk and dv in registers) and
//         streams the queries t >= key through shared memory:
//         dv += P dO,  dS = P (dO.v - D),  dk += dS q scale;
//      c) dQ: a block owns 64 queries and streams the keys t2 <= t: dq += dS k scale.
//    Each sum is one thread's, in a fixed order: deterministic. dinp is OVERWRITTEN.
//    All of its math is fp32 on CUDA cores. Head sizes 16, 32, 64 and 128.
//
// 3. flash on tensor cores (section "3. flash on tensor cores" below): the same math as 2,
//    with the T x T x hs products on mma.sync (bf16 in, fp32 accumulate). bf16 build only, head
//    sizes 16, 32 and 64 (every GPT-2 size uses 64; the tiny model 32).
//
// attention_forward / attention_backward, what the model's default attention op calls
// (llmc/model/ops.h), pick 3 where it applies and 2 otherwise; both save the same lse, so either
// backward fits either forward.
//
// 4. with a KV cache, for generation (attention_forward_cached, the last section): the op
//    llmc/model/generate.h installs in place of attention for the cached forward.
#pragma once

#include "common.cuh"

// ---------------------------------------------------------------------------------------
// 1. materialized

static inline size_t attention_state_size_materialized(int B, int T, int NH) { return (size_t)B * NH * T * T; }

__global__ void attention_materialized_forward_kernel(floatX* out, float* att, const floatX* inp,
                                                      int B, int T, int C, int NH) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // = (b * NH + h) * T + t
    int lane = threadIdx.x % 32;
    if (row >= B * NH * T) { return; }
    int t = row % T, h = (row / T) % NH, b = row / (T * NH);
    int hs = C / NH;
    float scale = rsqrtf((float)hs);
    const floatX* q = inp + ((size_t)b * T + t) * 3 * C + h * hs;
    float* p = att + (size_t)row * T;
    float maxval = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const floatX* k = inp + ((size_t)b * T + t2) * 3 * C + C + h * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) { s += to_float(q[i]) * to_float(k[i]); }
        s *= scale;
        p[t2] = s;
        maxval = fmaxf(maxval, s);
    }
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) { float e = expf(p[t2] - maxval); p[t2] = e; sum += e; }
    float inv = 1.0f / warp_sum(sum);
    for (int t2 = lane; t2 < T; t2 += 32) { p[t2] = t2 <= t ? p[t2] * inv : 0.0f; }
    __syncwarp();   // the row of P, written by all lanes, is read by all lanes below
    for (int i = lane; i < hs; i += 32) {
        float o = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) { o += p[t2] * to_float(inp[((size_t)b * T + t2) * 3 * C + 2 * C + h * hs + i]); }
        out[((size_t)b * T + t) * C + h * hs + i] = from_float(o);
    }
}

// dS[row][t2] = P (dP - rowsum(P dP)) for t2 <= t, with dP[t2] = dO_t . v_t2 (unscaled)
__global__ void attention_materialized_ds_kernel(float* dS, const floatX* dout, const floatX* inp, const float* att,
                                                 int B, int T, int C, int NH) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= B * NH * T) { return; }
    int t = row % T, h = (row / T) % NH, b = row / (T * NH);
    int hs = C / NH;
    const floatX* dO = dout + ((size_t)b * T + t) * C + h * hs;
    const float* p = att + (size_t)row * T;
    float* ds = dS + (size_t)row * T;
    float rowdot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const floatX* v = inp + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
        float dp = 0.0f;
        for (int i = 0; i < hs; i++) { dp += to_float(dO[i]) * to_float(v[i]); }
        ds[t2] = dp;
        rowdot += p[t2] * dp;
    }
    rowdot = warp_sum(rowdot);
    for (int t2 = lane; t2 <= t; t2 += 32) { ds[t2] = p[t2] * (ds[t2] - rowdot); }   // own elements only
}

// one thread per (b, t, h, i): dq over keys t2 <= t; dk, dv (for key position t) over queries >= t
__global__ void attention_materialized_dinp_kernel(floatX* dinp, const float* dS, const floatX* dout,
                                                   const floatX* inp, const float* att, int B, int T, int C, int NH) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) { return; }
    int hs = C / NH;
    int c = (int)(idx % C), t = (int)((idx / C) % T), b = (int)(idx / ((size_t)C * T));
    int h = c / hs;
    float scale = rsqrtf((float)hs);
    size_t head = ((size_t)b * NH + h) * T;   // row index of (b, h, 0) in att and dS
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        dq += dS[(head + t) * T + t2] * to_float(inp[((size_t)b * T + t2) * 3 * C + C + c]);
    }
    for (int tq = t; tq < T; tq++) {
        dk += dS[(head + tq) * T + t] * to_float(inp[((size_t)b * T + tq) * 3 * C + c]);
        dv += att[(head + tq) * T + t] * to_float(dout[((size_t)b * T + tq) * C + c]);
    }
    floatX* d = dinp + ((size_t)b * T + t) * 3 * C;
    d[c] = from_float(dq * scale);
    d[C + c] = from_float(dk * scale);
    d[2 * C + c] = from_float(dv);
}

static inline void attention_forward_materialized(floatX* out, float* att, const floatX* inp, int B, int T, int C, int NH) {
    int rows = B * NH * T;
    attention_materialized_forward_kernel<<<(int)ceil_div(rows, 8), 256>>>(out, att, inp, B, T, C, NH);
    cudaCheckLaunch();
}

static inline void attention_backward_materialized(floatX* dinp, const floatX* dout, const floatX* inp, const float* att,
                                                   int B, int T, int C, int NH) {
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    float* dS = (float*)scratch_reserve(&scratch, &scratch_cap, attention_state_size_materialized(B, T, NH) * sizeof(float));
    int rows = B * NH * T;
    attention_materialized_ds_kernel<<<(int)ceil_div(rows, 8), 256>>>(dS, dout, inp, att, B, T, C, NH);
    cudaCheckLaunch();
    attention_materialized_dinp_kernel<<<(int)ceil_div((size_t)B * T * C, 256), 256>>>(dinp, dS, dout, inp, att, B, T, C, NH);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------
// 2. flash

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

// ---------------------------------------------------------------------------------------
// 3. flash on tensor cores (bf16 build only; the default there for head sizes 16, 32, 64)
//
// The same math as 2 (lse saved, P recomputed, D = dO.O by re-running the forward, no
// atomics), with every T x T x hs product on tensor cores: mma.sync.m16n8k16, bf16 inputs,
// fp32 accumulation (sm_80 and newer; the bf16 build already requires 8.0). Softmax, the
// running max/sum, P, dS and all sums stay fp32; P and dS are rounded to bf16 only as the A
// operand of the next mma, as in FlashAttention-2.
// Each block has 4 warps; a warp owns 16 rows (queries, or keys in the dK/dV kernel) and a
// 64-wide tile of the other side streams through shared memory (bf16, rows padded by 8
// elements so that the fragment loads hit 32 distinct banks). Fragment layouts (PTX ISA,
// m16n8k16; g = lane / 4, c = lane % 4):
//   A (16x16, row): a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..)
//   B (16x8, col) : b0 = (k 2c..2c+1, n g), b1 = (k 2c+8..2c+9, n g)
//   C (16x8)      : c0,c1 = (g, 2c..2c+1), c2,c3 = (g+8, 2c..2c+1)
// so the C fragments of two adjacent 8-column tiles are exactly the A fragment of a 16-wide
// k slice: P (or dS) goes from one mma's output to the next mma's input in registers.
// B operands that are row-major in k ("x[k][n]" with k the streamed rows) come from shared
// memory through ldmatrix.trans; those with k along the head dimension are single 32-bit
// shared loads. Row fragments of the block's own rows are loaded once from global memory.
//   forward (grid ceil(T/64) x B*NH, longest query tiles first): per key tile,
//     S = Q K^T (log2 units: times scale * log2 e), causal mask on the diagonal tile, row max
//     over the quad (shuffles), O and l rescaled by exp2(m_old - m_new), P = exp2(S - m),
//     O += P V. lse = (m + log2 l) ln 2 (natural log, the same state as versions 1 and 2).
//     With DELTA: D = dO . O (O = o / l in fp32) instead of writing O and lse.
//   dK, dV (grid ceil(T/64) x B*NH; a block owns 64 keys, loops over query tiles >= its own):
//     S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T - lse2[q]), dS^T = P^T (dP^T - D[q]),
//     dV += P^T dO, dK += dS^T Q; dK scaled at the end.
//   dQ (a block owns 64 queries, loops over key tiles <= its own):
//     S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K; scaled at the end.
// Every output element is accumulated by one thread in a fixed order: deterministic.
// Requirements (else the CUDA-core flash of section 2 runs): bf16 build, hs in {16, 32, 64},
// 16-byte aligned inp, out, dout, dinp.

#if FLOATX_IS_BF16
#include <stdint.h>

#define FT_ROWS 64       // rows a block owns (4 warps x 16) = width of a streamed tile
#define FT_THREADS 128
#define FT_LOG2E 1.4426950408889634f
#define FT_LN2 0.6931471805599453f

// c += a * b (16x8x16, bf16 in, fp32 accumulate)
__device__ __forceinline__ void ft_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    (void)c; (void)a; (void)b0; (void)b1;
    __trap();   // unreachable: backend_init refuses the bf16 build below compute capability 8.0
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// B fragments of two adjacent 8-wide n tiles from x[k][n] (row-major, leading dimension ld)
// stored in shared memory: rows k0 .. k0+15, columns n0 .. n0+15.
// r[0], r[1] = b0, b1 of columns n0..n0+7; r[2], r[3] = those of n0+8..n0+15.
__device__ __forceinline__ void ft_ldsm_b_trans(uint32_t r[4], const __nv_bfloat16* x, int ld, int k0, int n0) {
    int lane = threadIdx.x % 32, mat = lane / 8;
    const __nv_bfloat16* p = x + (size_t)(k0 + (mat & 1) * 8 + lane % 8) * ld + n0 + (mat >> 1) * 8;
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ uint32_t ft_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // .x (lower address, lower bits) = lo
    return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t ft_ld32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Rows [r0, r0 + FT_ROWS) of src (row stride `stride` elements, HS columns) into s[FT_ROWS][HS + 8],
// 16 bytes per load; rows >= T are zero. All threads of the block take part.
template <int HS>
__device__ __forceinline__ void ft_load_tile(__nv_bfloat16* s, const __nv_bfloat16* src, size_t stride, int r0, int T) {
    constexpr int CH = HS / 8;
    for (int idx = threadIdx.x; idx < FT_ROWS * CH; idx += FT_THREADS) {
        int r = idx / CH, c = idx % CH;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + r < T) { v = *reinterpret_cast<const uint4*>(src + (size_t)(r0 + r) * stride + c * 8); }
        *reinterpret_cast<uint4*>(s + r * (HS + 8) + c * 8) = v;
    }
}

// A fragments of rows r0 .. r0+15 (all HS columns) straight from global memory; rows >= T are zero
template <int HS>
__device__ __forceinline__ void ft_load_a(uint32_t a[HS / 16][4], const __nv_bfloat16* src, size_t stride, int r0, int T) {
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    bool ok0 = r0 + g < T, ok1 = r0 + g + 8 < T;
    const __nv_bfloat16* p0 = src + (size_t)(ok0 ? r0 + g : 0) * stride + 2 * c;
    const __nv_bfloat16* p1 = src + (size_t)(ok1 ? r0 + g + 8 : 0) * stride + 2 * c;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        a[kk][0] = ok0 ? ft_ld32(p0 + kk * 16) : 0u;
        a[kk][1] = ok1 ? ft_ld32(p1 + kk * 16) : 0u;
        a[kk][2] = ok0 ? ft_ld32(p0 + kk * 16 + 8) : 0u;
        a[kk][3] = ok1 ? ft_ld32(p1 + kk * 16 + 8) : 0u;
    }
}

// acc[n] (16 x FT_ROWS, as FT_ROWS/8 C fragments) = A (16 x HS, fragments a) times x^T, x being
// FT_ROWS rows of HS in shared memory (x[n][k]: k along the head dimension, single 32-bit loads)
template <int HS>
__device__ __forceinline__ void ft_mma_abt(float acc[FT_ROWS / 8][4], const uint32_t a[HS / 16][4], const __nv_bfloat16* x) {
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int n = 0; n < FT_ROWS / 8; n++) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        const __nv_bfloat16* row = x + (n * 8 + g) * (HS + 8) + 2 * c;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) { ft_mma(acc[n], a[kk], ft_ld32(row + kk * 16), ft_ld32(row + kk * 16 + 8)); }
    }
}

// out[n] (16 x HS) += p (16 x FT_ROWS, C fragments, rounded to bf16 here) times x (FT_ROWS x HS
// in shared memory, k along the rows: ldmatrix.trans)
template <int HS>
__device__ __forceinline__ void ft_mma_pv(float out[HS / 8][4], const float p[FT_ROWS / 8][4], const __nv_bfloat16* x) {
#pragma unroll
    for (int j = 0; j < FT_ROWS / 16; j++) {
        uint32_t a[4] = {ft_pack(p[2 * j][0], p[2 * j][1]), ft_pack(p[2 * j][2], p[2 * j][3]),
                         ft_pack(p[2 * j + 1][0], p[2 * j + 1][1]), ft_pack(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
        for (int n = 0; n < HS / 8; n += 2) {
            uint32_t b[4];
            ft_ldsm_b_trans(b, x, HS + 8, j * 16, n * 8);
            ft_mma(out[n], a, b[0], b[1]);
            ft_mma(out[n + 1], a, b[2], b[3]);
        }
    }
}

__device__ __forceinline__ float ft_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float ft_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// grid (ceil(T / 64), B * NH), 128 threads, dynamic shared memory 2 * 64 * (HS + 8) bf16
template <int HS, bool DELTA>
__global__ void __launch_bounds__(FT_THREADS) attention_tc_forward_kernel(floatX* out, float* lse, float* delta,
        const floatX* dout, const floatX* inp, int T, int C, int NH) {
    extern __shared__ uint4 ft_smem[];
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(ft_smem);
    __nv_bfloat16* Vs = Ks + FT_ROWS * (HS + 8);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int qt = gridDim.x - 1 - blockIdx.x;   // the longest rows start first
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    size_t C3 = 3 * (size_t)C;
    const floatX* qsrc = inp + (size_t)b * T * C3 + h * HS;
    int q0 = qt * FT_ROWS, qw = q0 + warp * 16;
    int row0 = qw + g, row1 = qw + g + 8;
    const float sl2 = rsqrtf((float)HS) * FT_LOG2E;
    uint32_t qf[HS / 16][4];
    ft_load_a<HS>(qf, qsrc, C3, qw, T);
    float o[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f; }
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;   // rows row0, row1 (l: this thread's columns)
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * FT_ROWS;
        __syncthreads();   // the previous tile is no longer read
        ft_load_tile<HS>(Ks, qsrc + C, C3, k0, T);
        ft_load_tile<HS>(Vs, qsrc + 2 * C, C3, k0, T);
        __syncthreads();
        float s[FT_ROWS / 8][4];
        ft_mma_abt<HS>(s, qf, Ks);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < FT_ROWS / 8; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int key = k0 + n * 8 + 2 * c + e;
                float v0 = s[n][e] * sl2, v1 = s[n][2 + e] * sl2;
                if (kt == qt) {   // diagonal tile: key k0 <= row, so every row keeps a finite max
                    v0 = key <= row0 ? v0 : -INFINITY;
                    v1 = key <= row1 ? v1 : -INFINITY;
                }
                s[n][e] = v0;
                s[n][2 + e] = v1;
                mx0 = fmaxf(mx0, v0);
                mx1 = fmaxf(mx1, v1);
            }
        }
        float mn0 = fmaxf(m0, ft_quad_max(mx0)), mn1 = fmaxf(m1, ft_quad_max(mx1));
        float corr0 = exp2f(m0 - mn0), corr1 = exp2f(m1 - mn1);   // 0 on the first tile (m = -inf)
        m0 = mn0;
        m1 = mn1;
        l0 *= corr0;
        l1 *= corr1;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) { o[n][0] *= corr0; o[n][1] *= corr0; o[n][2] *= corr1; o[n][3] *= corr1; }
#pragma unroll
        for (int n = 0; n < FT_ROWS / 8; n++) {
            s[n][0] = exp2f(s[n][0] - m0);
            s[n][1] = exp2f(s[n][1] - m0);
            s[n][2] = exp2f(s[n][2] - m1);
            s[n][3] = exp2f(s[n][3] - m1);
            l0 += s[n][0] + s[n][1];
            l1 += s[n][2] + s[n][3];
        }
        ft_mma_pv<HS>(o, s, Vs);
    }
    l0 = ft_quad_sum(l0);
    l1 = ft_quad_sum(l1);
    float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    size_t lrow = (size_t)blockIdx.y * T;   // (b * NH + h) * T
    if (DELTA) {
        float d0 = 0.0f, d1 = 0.0f;
        const floatX* dO0 = dout + ((size_t)b * T + (row0 < T ? row0 : 0)) * C + h * HS + 2 * c;
        const floatX* dO1 = dout + ((size_t)b * T + (row1 < T ? row1 : 0)) * C + h * HS + 2 * c;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            if (row0 < T) {
                float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dO0 + n * 8));
                d0 += x.x * o[n][0] + x.y * o[n][1];
            }
            if (row1 < T) {
                float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dO1 + n * 8));
                d1 += x.x * o[n][2] + x.y * o[n][3];
            }
        }
        d0 = ft_quad_sum(d0) * inv0;
        d1 = ft_quad_sum(d1) * inv1;
        if (c == 0 && row0 < T) { delta[lrow + row0] = d0; }
        if (c == 0 && row1 < T) { delta[lrow + row1] = d1; }
    } else {
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            if (row0 < T) {
                *reinterpret_cast<__nv_bfloat162*>(out + ((size_t)b * T + row0) * C + h * HS + n * 8 + 2 * c) =
                    __floats2bfloat162_rn(o[n][0] * inv0, o[n][1] * inv0);
            }
            if (row1 < T) {
                *reinterpret_cast<__nv_bfloat162*>(out + ((size_t)b * T + row1) * C + h * HS + n * 8 + 2 * c) =
                    __floats2bfloat162_rn(o[n][2] * inv1, o[n][3] * inv1);
            }
        }
        if (c == 0 && row0 < T) { lse[lrow + row0] = (m0 + log2f(l0)) * FT_LN2; }
        if (c == 0 && row1 < T) { lse[lrow + row1] = (m1 + log2f(l1)) * FT_LN2; }
    }
}

// dK, dV: grid (ceil(T / 64), B * NH), a block owns 64 keys (the most work first: key tile 0
// sees every query tile). Shared: Qs, dOs (64 x (HS + 8) bf16 each), lse2 and D (64 floats each).
template <int HS>
__global__ void __launch_bounds__(FT_THREADS) attention_tc_dkdv_kernel(floatX* dinp, const floatX* dout,
        const floatX* inp, const float* lse, const float* delta, int T, int C, int NH) {
    extern __shared__ uint4 ft_smem[];
    __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(ft_smem);
    __nv_bfloat16* dOs = Qs + FT_ROWS * (HS + 8);
    float* lse_s = reinterpret_cast<float*>(dOs + FT_ROWS * (HS + 8));   // lse * log2 e; +inf past T (P = 0)
    float* d_s = lse_s + FT_ROWS;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int kt = blockIdx.x, nt = gridDim.x;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    size_t C3 = 3 * (size_t)C;
    const floatX* qsrc = inp + (size_t)b * T * C3 + h * HS;
    const floatX* dosrc = dout + (size_t)b * T * C + h * HS;
    int kw = kt * FT_ROWS + warp * 16;
    int key0 = kw + g, key1 = kw + g + 8;
    const float scale = rsqrtf((float)HS), sl2 = scale * FT_LOG2E;
    uint32_t kf[HS / 16][4], vf[HS / 16][4];
    ft_load_a<HS>(kf, qsrc + C, C3, kw, T);
    ft_load_a<HS>(vf, qsrc + 2 * C, C3, kw, T);
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
        dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    }
    size_t lrow = (size_t)blockIdx.y * T;
    for (int qt = kt; qt < nt; qt++) {   // causal: earlier queries see none of these keys
        int q0 = qt * FT_ROWS;
        __syncthreads();
        ft_load_tile<HS>(Qs, qsrc, C3, q0, T);
        ft_load_tile<HS>(dOs, dosrc, (size_t)C, q0, T);
        for (int r = threadIdx.x; r < FT_ROWS; r += FT_THREADS) {
            int q = q0 + r;
            lse_s[r] = q < T ? lse[lrow + q] * FT_LOG2E : INFINITY;
            d_s[r] = q < T ? delta[lrow + q] : 0.0f;
        }
        __syncthreads();
        float s[FT_ROWS / 8][4], dp[FT_ROWS / 8][4];   // rows: keys key0, key1; columns: queries
        ft_mma_abt<HS>(s, kf, Qs);
        ft_mma_abt<HS>(dp, vf, dOs);
#pragma unroll
        for (int n = 0; n < FT_ROWS / 8; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int col = n * 8 + 2 * c + e, q = q0 + col;
                float l2 = lse_s[col], dd = d_s[col];
                float p0 = exp2f(s[n][e] * sl2 - l2), p1 = exp2f(s[n][2 + e] * sl2 - l2);
                if (qt == kt) {   // diagonal tile: query q sees key only when key <= q
                    p0 = key0 <= q ? p0 : 0.0f;
                    p1 = key1 <= q ? p1 : 0.0f;
                }
                s[n][e] = p0;
                s[n][2 + e] = p1;
                dp[n][e] = p0 * (dp[n][e] - dd);
                dp[n][2 + e] = p1 * (dp[n][2 + e] - dd);
            }
        }
        ft_mma_pv<HS>(dv, s, dOs);   // dV += P^T dO
        ft_mma_pv<HS>(dk, dp, Qs);   // dK += dS^T Q
    }
    floatX* d0 = dinp + ((size_t)b * T + key0) * C3 + h * HS + 2 * c;
    floatX* d1 = dinp + ((size_t)b * T + key1) * C3 + h * HS + 2 * c;
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        if (key0 < T) {
            *reinterpret_cast<__nv_bfloat162*>(d0 + C + n * 8) = __floats2bfloat162_rn(dk[n][0] * scale, dk[n][1] * scale);
            *reinterpret_cast<__nv_bfloat162*>(d0 + 2 * C + n * 8) = __floats2bfloat162_rn(dv[n][0], dv[n][1]);
        }
        if (key1 < T) {
            *reinterpret_cast<__nv_bfloat162*>(d1 + C + n * 8) = __floats2bfloat162_rn(dk[n][2] * scale, dk[n][3] * scale);
            *reinterpret_cast<__nv_bfloat162*>(d1 + 2 * C + n * 8) = __floats2bfloat162_rn(dv[n][2], dv[n][3]);
        }
    }
}

// dQ: grid (ceil(T / 64), B * NH), a block owns 64 queries (longest first). Shared: Ks, Vs.
template <int HS>
__global__ void __launch_bounds__(FT_THREADS) attention_tc_dq_kernel(floatX* dinp, const floatX* dout,
        const floatX* inp, const float* lse, const float* delta, int T, int C, int NH) {
    extern __shared__ uint4 ft_smem[];
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(ft_smem);
    __nv_bfloat16* Vs = Ks + FT_ROWS * (HS + 8);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int qt = gridDim.x - 1 - blockIdx.x;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    size_t C3 = 3 * (size_t)C;
    const floatX* qsrc = inp + (size_t)b * T * C3 + h * HS;
    int qw = qt * FT_ROWS + warp * 16;
    int row0 = qw + g, row1 = qw + g + 8;
    const float scale = rsqrtf((float)HS), sl2 = scale * FT_LOG2E;
    uint32_t qf[HS / 16][4], df[HS / 16][4];
    ft_load_a<HS>(qf, qsrc, C3, qw, T);
    ft_load_a<HS>(df, dout + (size_t)b * T * C + h * HS, (size_t)C, qw, T);
    size_t lrow = (size_t)blockIdx.y * T;
    float l2_0 = row0 < T ? lse[lrow + row0] * FT_LOG2E : INFINITY, l2_1 = row1 < T ? lse[lrow + row1] * FT_LOG2E : INFINITY;
    float dd0 = row0 < T ? delta[lrow + row0] : 0.0f, dd1 = row1 < T ? delta[lrow + row1] : 0.0f;
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) { dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f; }
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * FT_ROWS;
        __syncthreads();
        ft_load_tile<HS>(Ks, qsrc + C, C3, k0, T);
        ft_load_tile<HS>(Vs, qsrc + 2 * C, C3, k0, T);
        __syncthreads();
        float s[FT_ROWS / 8][4], dp[FT_ROWS / 8][4];
        ft_mma_abt<HS>(s, qf, Ks);    // S = Q K^T
        ft_mma_abt<HS>(dp, df, Vs);   // dP = dO V^T
#pragma unroll
        for (int n = 0; n < FT_ROWS / 8; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int key = k0 + n * 8 + 2 * c + e;
                float p0 = exp2f(s[n][e] * sl2 - l2_0), p1 = exp2f(s[n][2 + e] * sl2 - l2_1);
                if (kt == qt) {
                    p0 = key <= row0 ? p0 : 0.0f;
                    p1 = key <= row1 ? p1 : 0.0f;
                }
                dp[n][e] = p0 * (dp[n][e] - dd0);
                dp[n][2 + e] = p1 * (dp[n][2 + e] - dd1);
            }
        }
        ft_mma_pv<HS>(dq, dp, Ks);   // dQ += dS K
    }
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        if (row0 < T) {
            *reinterpret_cast<__nv_bfloat162*>(dinp + ((size_t)b * T + row0) * C3 + h * HS + n * 8 + 2 * c) =
                __floats2bfloat162_rn(dq[n][0] * scale, dq[n][1] * scale);
        }
        if (row1 < T) {
            *reinterpret_cast<__nv_bfloat162*>(dinp + ((size_t)b * T + row1) * C3 + h * HS + n * 8 + 2 * c) =
                __floats2bfloat162_rn(dq[n][2] * scale, dq[n][3] * scale);
        }
    }
}

// dynamic shared memory above 48 KiB needs an opt-in (HS = 128 would; set it anyway, once)
template <typename K>
static inline void ft_prepare(K kernel, int smem, bool* done) {
    if (!*done) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        *done = true;
    }
}

template <int HS>
static void attention_tc_launch_forward(floatX* out, float* lse, float* delta, const floatX* dout, const floatX* inp,
                                        int B, int T, int C, int NH, bool want_delta) {
    static bool ready[2] = {false, false};
    dim3 grid((unsigned)ceil_div(T, FT_ROWS), B * NH);
    int smem = (int)(2 * FT_ROWS * (HS + 8) * sizeof(__nv_bfloat16));
    if (want_delta) {
        ft_prepare(attention_tc_forward_kernel<HS, true>, smem, &ready[1]);
        attention_tc_forward_kernel<HS, true><<<grid, FT_THREADS, smem>>>(out, lse, delta, dout, inp, T, C, NH);
    } else {
        ft_prepare(attention_tc_forward_kernel<HS, false>, smem, &ready[0]);
        attention_tc_forward_kernel<HS, false><<<grid, FT_THREADS, smem>>>(out, lse, delta, dout, inp, T, C, NH);
    }
    cudaCheckLaunch();
}

template <int HS>
static void attention_tc_launch_backward(floatX* dinp, const floatX* dout, const floatX* inp, const float* lse,
                                         float* delta, int B, int T, int C, int NH) {
    static bool ready[2] = {false, false};
    attention_tc_launch_forward<HS>(NULL, NULL, delta, dout, inp, B, T, C, NH, true);
    dim3 grid((unsigned)ceil_div(T, FT_ROWS), B * NH);
    int smem_kv = (int)(2 * FT_ROWS * (HS + 8) * sizeof(__nv_bfloat16) + 2 * FT_ROWS * sizeof(float));
    ft_prepare(attention_tc_dkdv_kernel<HS>, smem_kv, &ready[0]);
    attention_tc_dkdv_kernel<HS><<<grid, FT_THREADS, smem_kv>>>(dinp, dout, inp, lse, delta, T, C, NH);
    cudaCheckLaunch();
    int smem_q = (int)(2 * FT_ROWS * (HS + 8) * sizeof(__nv_bfloat16));
    ft_prepare(attention_tc_dq_kernel<HS>, smem_q, &ready[1]);
    attention_tc_dq_kernel<HS><<<grid, FT_THREADS, smem_q>>>(dinp, dout, inp, lse, delta, T, C, NH);
    cudaCheckLaunch();
}
#endif   // FLOATX_IS_BF16

// whether the tensor-core kernels take this call (pointers: every tensor the call touches)
static inline bool attention_tc_supported(int C, int NH, const void* p0, const void* p1, const void* p2) {
#if FLOATX_IS_BF16
    int hs = C / NH;
    bool aligned = (uintptr_t)p0 % 16 == 0 && (uintptr_t)p1 % 16 == 0 && (uintptr_t)p2 % 16 == 0;
    return aligned && C % NH == 0 && (hs == 16 || hs == 32 || hs == 64);
#else
    (void)C; (void)NH; (void)p0; (void)p1; (void)p2;
    return false;   // the fp32 build keeps the fp32 CUDA-core kernels
#endif
}

// out (B,T,C); lse (B,NH,T); the caller has checked attention_tc_supported
static inline void attention_forward_flash_tc(floatX* out, float* lse, const floatX* inp, int B, int T, int C, int NH) {
#if FLOATX_IS_BF16
    switch (C / NH) {
        case 16: attention_tc_launch_forward<16>(out, lse, NULL, NULL, inp, B, T, C, NH, false); break;
        case 32: attention_tc_launch_forward<32>(out, lse, NULL, NULL, inp, B, T, C, NH, false); break;
        case 64: attention_tc_launch_forward<64>(out, lse, NULL, NULL, inp, B, T, C, NH, false); break;
        default: die("attention_forward_flash_tc: head size %d is not supported", C / NH);
    }
#else
    (void)out; (void)lse; (void)inp; (void)B; (void)T; (void)C; (void)NH;
    die("attention_forward_flash_tc needs the bf16 build");
#endif
}

static inline void attention_backward_flash_tc(floatX* dinp, const floatX* dout, const floatX* inp, const float* lse,
                                               int B, int T, int C, int NH) {
#if FLOATX_IS_BF16
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    float* delta = (float*)scratch_reserve(&scratch, &scratch_cap, attention_state_size(B, T, NH) * sizeof(float));
    switch (C / NH) {
        case 16: attention_tc_launch_backward<16>(dinp, dout, inp, lse, delta, B, T, C, NH); break;
        case 32: attention_tc_launch_backward<32>(dinp, dout, inp, lse, delta, B, T, C, NH); break;
        case 64: attention_tc_launch_backward<64>(dinp, dout, inp, lse, delta, B, T, C, NH); break;
        default: die("attention_backward_flash_tc: head size %d is not supported", C / NH);
    }
#else
    (void)dinp; (void)dout; (void)inp; (void)lse; (void)B; (void)T; (void)C; (void)NH;
    die("attention_backward_flash_tc needs the bf16 build");
#endif
}

// the names the model calls: tensor cores when they apply (bf16 build, hs 16/32/64, aligned),
// else the CUDA-core flash kernels. Both save the same lse, so either backward fits either forward.
static inline void attention_forward(floatX* out, float* att, const floatX* inp, int B, int T, int C, int NH) {
    if (attention_tc_supported(C, NH, out, inp, inp)) {
        attention_forward_flash_tc(out, att, inp, B, T, C, NH);
    } else {
        attention_forward_flash(out, att, inp, B, T, C, NH);
    }
}
static inline void attention_backward(floatX* dinp, const floatX* dout, const floatX* inp, const float* att,
                                      int B, int T, int C, int NH) {
    if (attention_tc_supported(C, NH, dinp, dout, inp)) {
        attention_backward_flash_tc(dinp, dout, inp, att, B, T, C, NH);
    } else {
        attention_backward_flash(dinp, dout, inp, att, B, T, C, NH);
    }
}

// ---------------------------------------------------------------------------------------
// 4. with a KV cache, for generation (llmc/model/generate.h; the math is in llmc/cpu/attention.h).
// Token j of the call belongs to cache row r = rows[j] at position p = positions[j];
// kcache, vcache are (rows, maxT, C) for one layer. Two kernels, so that every store is done
// before any token attends (a token reads the keys of the other tokens of its row in the call):
//   a) store: one thread per element, kcache[r, p, c] = k_j[c], vcache[r, p, c] = v_j[c];
//   b) attend: one block per (token j, head h), fp32 math. The block's threads split the keys
//      t2 = 0..p: s[t2] = q . k_t2 / sqrt(hs) into shared memory (maxT floats), then the block
//      max and sum give the softmax, then thread i < hs sums out[i] = sum_t2 P[t2] v_t2[i] in
//      t2 order. No atomics: deterministic. Simple rather than fast (decode is one query).
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
