// Causal multi-head attention, flash on tensor cores: what the model runs in the bf16 build for
// head sizes 16, 32 and 64 (every GPT-2 size uses 64; the tiny model 32). bf16 build only.
//
// The same math as the CUDA-core flash kernels (attention_flash.cuh: lse saved, P recomputed,
// D = dO.O by re-running the forward, no atomics), with every T x T x hs product on tensor
// cores: mma.sync.m16n8k16, bf16 inputs, fp32 accumulation (sm_80 and newer; the bf16 build
// already requires 8.0). Softmax, the running max/sum, P, dS and all sums stay fp32; P and dS
// are rounded to bf16 only as the A operand of the next mma, as in FlashAttention-2.
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
//     O += P V. lse = (m + log2 l) ln 2 (natural log, the same state as the CUDA-core kernels).
//     With DELTA: D = dO . O (O = o / l in fp32) instead of writing O and lse.
//   dK, dV (grid ceil(T/64) x B*NH; a block owns 64 keys, loops over query tiles >= its own):
//     S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T - lse2[q]), dS^T = P^T (dP^T - D[q]),
//     dV += P^T dO, dK += dS^T Q; dK scaled at the end.
//   dQ (a block owns 64 queries, loops over key tiles <= its own):
//     S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K; scaled at the end.
// Every output element is accumulated by one thread in a fixed order: deterministic.
// Requirements (else the CUDA-core flash kernels run): bf16 build, hs in {16, 32, 64},
// 16-byte aligned inp, out, dout, dinp.
#pragma once

#include "attention_flash.cuh"   // attention_state_size: the same lse state

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
