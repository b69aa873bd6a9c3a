// Matrix multiplication for the linear layers (nn.Linear): the CPU's hot spot.
//
//   forward : out[bt][o]      = bias[o] + sum_c inp[bt][c] * weight[o][c]
//   backward: dinp[bt][c]     = sum_o dout[bt][o] * weight[o][c]       (overwrites dinp)
//             dweight[o][c]  += sum_bt dout[bt][o] * inp[bt][c]        (accumulates)
//             dbias[o]       += sum_bt dout[bt][o]                     (accumulates)
//
// FLOPs: each product is one multiply-add per (bt, o, c) triple, so the forward costs
// 2*BT*C*OC FLOPs and the backward twice that. For GPT-2 124M nearly all of the
// ~6 * 124M * B*T FLOPs of a training step are spent in these three products.
//
// All three are the same operation, a GEMM  Cm[m][n] (+)= sum_k A[m][k] * Bm[k][n],
// seen through different strides (A(m,k) = A[m*sam + k*sak], Bm(k,n) = Bm[k*sbk + n*sbn]):
//   forward : m=bt n=o k=c    A=inp    (sam=C,  sak=1)   Bm=weight (sbk=1, sbn=C)
//   dinp    : m=bt n=c k=o    A=dout   (sam=OC, sak=1)   Bm=weight (sbk=C, sbn=1)
//   dweight : m=o  n=c k=bt   A=dout   (sam=1,  sak=OC)  Bm=inp    (sbk=C, sbn=1)
// so we write one fast, strided GEMM (gemm_blocked) and call it three times.
//
// Build with -DLLMC_OPENBLAS to use cblas_sgemm instead of our kernel.
// Both paths are deterministic for a fixed thread count: every output element is summed
// by one thread in a fixed order (no atomics, no split of the k sum across threads).
#pragma once

#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef LLMC_OPENBLAS
#include <cblas.h>
#endif

// ----------------------------------------------------------------------------
// reference versions: obviously correct triple loops (used by tests and benchmarks)

static inline void matmul_forward_naive(float* out, const float* inp, const float* weight, const float* bias,
                                 int B, int T, int C, int OC) {
    for (int bt = 0; bt < B * T; bt++) {
        for (int o = 0; o < OC; o++) {
            float val = (bias != NULL) ? bias[o] : 0.0f;
            for (int c = 0; c < C; c++) { val += inp[(size_t)bt * C + c] * weight[(size_t)o * C + c]; }
            out[(size_t)bt * OC + o] = val;
        }
    }
}

static inline void matmul_backward_naive(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    for (int bt = 0; bt < BT; bt++) {
        for (int c = 0; c < C; c++) {
            float val = 0.0f;
            for (int o = 0; o < OC; o++) { val += dout[(size_t)bt * OC + o] * weight[(size_t)o * C + c]; }
            dinp[(size_t)bt * C + c] = val;
        }
    }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            float val = 0.0f;
            for (int bt = 0; bt < BT; bt++) { val += dout[(size_t)bt * OC + o] * inp[(size_t)bt * C + c]; }
            dweight[(size_t)o * C + c] += val;
        }
        if (dbias != NULL) {
            float val = 0.0f;
            for (int bt = 0; bt < BT; bt++) { val += dout[(size_t)bt * OC + o]; }
            dbias[o] += val;
        }
    }
}

// dbias[o] += sum_bt dout[bt][o]: threads own disjoint column chunks, rows added in order.
static inline void matmul_bias_backward(float* dbias, const float* dout, int BT, int OC) {
    const int CH = 256;  // columns per chunk: the inner loop is contiguous and vectorizes
    #pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += CH) {
        float acc[CH] = {};
        int n = (OC - o0 < CH) ? OC - o0 : CH;
        for (int bt = 0; bt < BT; bt++) {
            const float* row = dout + (size_t)bt * OC + o0;
            for (int j = 0; j < n; j++) { acc[j] += row[j]; }
        }
        for (int j = 0; j < n; j++) { dbias[o0 + j] += acc[j]; }
    }
}

// ----------------------------------------------------------------------------
// our own kernel: cache-blocked, packed, register-blocked GEMM (the BLIS recipe)
//
// Register block (micro-kernel): an MR x NR tile of Cm lives in registers while we run over
// kc values of k. Per k it loads NR floats of Bm (NR/16 AVX-512 vectors), broadcasts MR
// floats of A, and does MR*NR multiply-adds: 6*32 = 192 FMAs (12 vector FMAs) for 2 vector
// loads + 6 broadcasts. 12 accumulators hide the 4-cycle FMA latency (2 FMA pipes).
// Cache blocks: the k range is cut in KC pieces; a KC x NR sliver of Bm (32 KiB) stays in
// the 48 KiB L1 while all the MR-row slivers of an MC x KC block of A (up to 264 KiB, in
// the 1 MiB L2) stream past it. Before use, both blocks are *packed*: copied into
// contiguous buffers in exactly the order the micro-kernel reads them (this also does any
// transposition and pads partial slivers with zeros, so the micro-kernel has no edge cases).
// Threads split the output into MC x NC tiles, each tile owned by one thread.
#ifndef MM_MR
#define MM_MR 6      // rows of the register block
#define MM_NR 32     // cols of the register block (two 16-float AVX-512 vectors)
#define MM_KC 256    // depth of a packed block
#define MM_MC 264    // max rows of an A block (multiple of MR)
#define MM_NC 128    // max cols of a Bm block (multiple of NR)
#endif

// Cm[0:mr][0:nr] (+)= sum_p a[p][0:MR] (outer product) b[p][0:NR]
// a: packed MR-sliver (a[p*MR + i]), b: packed NR-sliver (b[p*NR + j]).
static inline void mm_micro_kernel(int kc, const float* __restrict a, const float* __restrict b,
                                   float* __restrict c, size_t ldc, int mr, int nr, bool accumulate) {
    float acc[MM_MR][MM_NR] = {};  // g++ keeps this in 12 zmm registers
    for (int p = 0; p < kc; p++) {
        for (int i = 0; i < MM_MR; i++) {
            float ai = a[p * MM_MR + i];
            for (int j = 0; j < MM_NR; j++) { acc[i][j] += ai * b[p * MM_NR + j]; }
        }
    }
    if (mr == MM_MR && nr == MM_NR) {  // full tile: fixed trip counts, vectorized stores
        for (int i = 0; i < MM_MR; i++) {
            for (int j = 0; j < MM_NR; j++) { c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + acc[i][j]; }
        }
    } else {  // edge tile: write only the valid part
        for (int i = 0; i < mr; i++) {
            for (int j = 0; j < nr; j++) { c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + acc[i][j]; }
        }
    }
}

// Copy the mc x kc block A(m0.., k0..) into MR-row slivers: dst[s*MR*kc + p*MR + i] = A(m0+s*MR+i, k0+p)
static inline void mm_pack_a(float* dst, const float* A, size_t sam, size_t sak, int m0, int mc, int k0, int kc) {
    for (int s = 0; s < mc; s += MM_MR, dst += (size_t)MM_MR * kc) {
        int rows = (mc - s < MM_MR) ? mc - s : MM_MR;
        for (int p = 0; p < kc; p++) {
            const float* src = A + (size_t)(m0 + s) * sam + (size_t)(k0 + p) * sak;
            for (int i = 0; i < MM_MR; i++) { dst[p * MM_MR + i] = (i < rows) ? src[i * sam] : 0.0f; }
        }
    }
}

// Copy the kc x nc block Bm(k0.., n0..) into NR-col slivers: dst[s*NR*kc + p*NR + j] = Bm(k0+p, n0+s*NR+j)
static inline void mm_pack_b(float* dst, const float* Bm, size_t sbk, size_t sbn, int k0, int kc, int n0, int nc) {
    for (int s = 0; s < nc; s += MM_NR, dst += (size_t)MM_NR * kc) {
        int cols = (nc - s < MM_NR) ? nc - s : MM_NR;
        if (sbn == 1 && cols == MM_NR) {  // rows of Bm contiguous: plain vector copies
            for (int p = 0; p < kc; p++) {
                const float* src = Bm + (size_t)(k0 + p) * sbk + (n0 + s);
                for (int j = 0; j < MM_NR; j++) { dst[p * MM_NR + j] = src[j]; }
            }
        } else {  // general / transposed: walk each column of Bm contiguously along k
            for (int j = 0; j < MM_NR; j++) {
                const float* src = Bm + (size_t)(n0 + s + j) * sbn + (size_t)k0 * sbk;
                for (int p = 0; p < kc; p++) { dst[p * MM_NR + j] = (j < cols) ? src[p * sbk] : 0.0f; }
            }
        }
    }
}

// Cm (M x N, row stride ldc) = (accumulate ? Cm : 0) + A (M x K) * Bm (K x N), strided A and Bm.
static inline void gemm_blocked(int M, int N, int K, const float* A, size_t sam, size_t sak,
                         const float* Bm, size_t sbk, size_t sbn, float* Cm, size_t ldc, bool accumulate) {
    if (M <= 0 || N <= 0) { return; }
    // Equal-sized tiles (rounded to the register block) avoid a thin leftover tile.
    int tm = (M + MM_MC - 1) / MM_MC, tn = (N + MM_NC - 1) / MM_NC, tk = (K + MM_KC - 1) / MM_KC;
    int mc = ((M + tm - 1) / tm + MM_MR - 1) / MM_MR * MM_MR;
    int nc = ((N + tn - 1) / tn + MM_NR - 1) / MM_NR * MM_NR;
    int kcb = (tk > 0) ? (K + tk - 1) / tk : 0;
    tm = (M + mc - 1) / mc;
    tn = (N + nc - 1) / nc;
    if (K <= 0) {  // empty sum: the result is 0 (or unchanged)
        if (!accumulate) { for (int m = 0; m < M; m++) { memset(Cm + m * ldc, 0, (size_t)N * sizeof(float)); } }
        return;
    }
    #pragma omp parallel
    {
        // per-thread packing buffers, kept between calls (64-byte aligned, grown on demand)
        static thread_local float* buf = NULL;
        static thread_local size_t buf_size = 0;
        size_t need = (size_t)(mc + nc) * kcb;
        if (need > buf_size) {
            free(buf);
            buf = (float*)aligned_alloc(64, (need * sizeof(float) + 63) / 64 * 64);
            buf_size = need;
        }
        float* Ap = buf;
        float* Bp = buf + (size_t)mc * kcb;
        #pragma omp for collapse(2) schedule(static)
        for (int it = 0; it < tm; it++) {
            for (int jt = 0; jt < tn; jt++) {
                int m0 = it * mc, mlen = (M - m0 < mc) ? M - m0 : mc;
                int n0 = jt * nc, nlen = (N - n0 < nc) ? N - n0 : nc;
                for (int k0 = 0; k0 < K; k0 += kcb) {
                    int kc = (K - k0 < kcb) ? K - k0 : kcb;
                    bool acc = accumulate || k0 > 0;
                    mm_pack_a(Ap, A, sam, sak, m0, mlen, k0, kc);
                    mm_pack_b(Bp, Bm, sbk, sbn, k0, kc, n0, nlen);
                    // B sliver (L1) outer, A slivers (L2) inner
                    for (int jr = 0; jr < nlen; jr += MM_NR) {
                        int nr = (nlen - jr < MM_NR) ? nlen - jr : MM_NR;
                        for (int ir = 0; ir < mlen; ir += MM_MR) {
                            int mr = (mlen - ir < MM_MR) ? mlen - ir : MM_MR;
                            mm_micro_kernel(kc, Ap + (size_t)ir * kc, Bp + (size_t)jr * kc,
                                            Cm + (size_t)(m0 + ir) * ldc + (n0 + jr), ldc, mr, nr, acc);
                        }
                    }
                }
            }
        }
    }
}

static inline void matmul_forward_blocked(float* out, const float* inp, const float* weight, const float* bias,
                                          int B, int T, int C, int OC) {
    int BT = B * T;
    if (bias != NULL) {  // start from the bias, then accumulate the product on top
        #pragma omp parallel for schedule(static)
        for (int bt = 0; bt < BT; bt++) { memcpy(out + (size_t)bt * OC, bias, (size_t)OC * sizeof(float)); }
    }
    gemm_blocked(BT, OC, C, inp, C, 1, weight, 1, C, out, OC, bias != NULL);
}

static inline void matmul_backward_blocked(float* dinp, float* dweight, float* dbias, const float* dout,
                                           const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    gemm_blocked(BT, C, OC, dout, OC, 1, weight, C, 1, dinp, C, false);   // dinp = dout . weight
    gemm_blocked(OC, C, BT, dout, 1, OC, inp, C, 1, dweight, C, true);    // dweight += dout^T . inp
    if (dbias != NULL) { matmul_bias_backward(dbias, dout, BT, OC); }
}

// ----------------------------------------------------------------------------
// OpenBLAS versions (-DLLMC_OPENBLAS): the same three products as cblas_sgemm calls.
// OpenBLAS (pthread build) keeps its own thread pool; we size it like the OpenMP team so
// that OMP_NUM_THREADS=1 means one core for everything.
#ifdef LLMC_OPENBLAS
static inline void matmul_forward_openblas(float* out, const float* inp, const float* weight, const float* bias,
                                           int B, int T, int C, int OC) {
    int BT = B * T;
    if (bias != NULL) {
        #pragma omp parallel for schedule(static)
        for (int bt = 0; bt < BT; bt++) { memcpy(out + (size_t)bt * OC, bias, (size_t)OC * sizeof(float)); }
    }
    openblas_set_num_threads(omp_get_max_threads());
    // out (BT x OC) = inp (BT x C) . weight^T (C x OC)  [+ out, which holds the bias]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C,
                1.0f, inp, C, weight, C, bias != NULL ? 1.0f : 0.0f, out, OC);
}

static inline void matmul_backward_openblas(float* dinp, float* dweight, float* dbias, const float* dout,
                                            const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    openblas_set_num_threads(omp_get_max_threads());
    // dinp (BT x C) = dout (BT x OC) . weight (OC x C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC,
                1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    // dweight (OC x C) += dout^T (OC x BT) . inp (BT x C)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT,
                1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias != NULL) { matmul_bias_backward(dbias, dout, BT, OC); }
}
#endif

// ----------------------------------------------------------------------------
// the API used by the model: picks the implementation at compile time

static inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                                  int B, int T, int C, int OC) {
#ifdef LLMC_OPENBLAS
    matmul_forward_openblas(out, inp, weight, bias, B, T, C, OC);
#else
    matmul_forward_blocked(out, inp, weight, bias, B, T, C, OC);
#endif
}

static inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, int B, int T, int C, int OC) {
#ifdef LLMC_OPENBLAS
    matmul_backward_openblas(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
#else
    matmul_backward_blocked(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
#endif
}
