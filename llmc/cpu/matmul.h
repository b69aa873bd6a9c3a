// Matrix multiplication for the linear layers (nn.Linear): where the CPU spends its time.
//
//   forward : out[bt][o]      = bias[o] + sum_c inp[bt][c] * weight[o][c]   (bias may be NULL)
//   backward: dinp[bt][c]     = sum_o dout[bt][o] * weight[o][c]            (OVERWRITES dinp)
//             dweight[o][c]  += sum_bt dout[bt][o] * inp[bt][c]             (accumulates)
//             dbias[o]       += sum_bt dout[bt][o]                          (accumulates; may be NULL)
//   shapes: inp (BT, C), weight (OC, C) as in torch, out (BT, OC), with BT = B*T.
//
// FLOPs: each product does one multiply-add (2 FLOPs) per (bt, o, c) triple, so the forward
// costs 2*BT*C*OC FLOPs and the backward 4*BT*C*OC. For GPT-2 these make up nearly all of the
// ~6 * (number of parameters) * BT FLOPs of a training step.
//
// All three products are one operation, a GEMM  Cm(m,n) (+)= sum_k A(m,k) * Bm(k,n),
// read through strides: A(m,k) = A[m*sam + k*sak] and Bm(k,n) = Bm[k*sbk + n*sbn]:
//   forward : m=bt n=o k=c    A=inp    (sam=C,  sak=1)    Bm=weight (sbk=1, sbn=C)
//   dinp    : m=bt n=c k=o    A=dout   (sam=OC, sak=1)    Bm=weight (sbk=C, sbn=1)
//   dweight : m=o  n=c k=bt   A=dout   (sam=1,  sak=OC)   Bm=inp    (sbk=C, sbn=1)
// so we write one fast strided GEMM (gemm_blocked) and call it three times.
//
// Implementations: our own kernel (default), or cblas_sgemm when built with -DLLMC_OPENBLAS.
// Both are deterministic for a fixed thread count: every output element is summed by one
// thread, in a fixed order (no atomics, the k sum is never split across threads). Ours even
// gives bit-identical results for any thread count.
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#ifdef LLMC_OPENBLAS
#include <cblas.h>
#endif

// ----------------------------------------------------------------------------
// reference versions: obviously correct triple loops (for tests and benchmarks; slow)

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
    for (int bt = 0; bt < BT && dinp != NULL; bt++) {
        for (int c = 0; c < C; c++) {
            float val = 0.0f;
            for (int o = 0; o < OC; o++) { val += dout[(size_t)bt * OC + o] * weight[(size_t)o * C + c]; }
            dinp[(size_t)bt * C + c] = val;
        }
    }
    for (int o = 0; o < OC && dweight != NULL; o++) {
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

// dbias[o] += sum_bt dout[bt][o], for both implementations: each thread owns whole chunks
// of columns and adds the rows in order (deterministic); the inner loop is contiguous.
static inline void matmul_bias_backward(float* dbias, const float* dout, int BT, int OC) {
    const int CH = 256;
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
// our kernel: a cache-blocked, packed, register-blocked GEMM (the BLIS / GotoBLAS recipe)
//
// Register block: the micro-kernel keeps an MR x NR tile of Cm in registers while it runs
// over kc values of k. Per k it loads NR floats of Bm (two 16-float AVX-512 vectors),
// broadcasts MR floats of A and does MR*NR = 192 multiply-adds in 12 vector FMAs: enough
// independent accumulators to hide the FMA latency, few loads per FMA. (Without AVX-512,
// 3x32 in 12 AVX2 FMAs.) On one Zen 5 core this loop runs at ~98% of the FMA peak.
// Cache blocks: k is cut in pieces of KC. A KC x NR sliver of Bm (32 KiB) stays in the
// 48 KiB L1 cache while the MR-row slivers of an MC x KC block of A (<= 264 KiB, kept in
// the 1 MiB L2) stream past it. The blocks are *packed* first: copied into contiguous
// buffers in exactly the order the micro-kernel reads them. Packing also does the
// transposes and pads partial slivers with zeros, so the micro-kernel has no edge cases.
// Threads: the output is cut in MC x NC tiles; each tile belongs to one thread.
#ifdef __AVX512F__
#define MM_MR 6      // rows of the register block: 6x32 = 12 zmm accumulators (of 32 registers)
#else
#define MM_MR 3      // AVX2 has only 16 ymm registers: 3x32 = 12 ymm accumulators
#endif
#define MM_NR 32     // columns of the register block
#define MM_KC 256    // depth of a packed block
#define MM_MC 264    // max rows of a tile (multiple of MR; >= 256 so BT=256 is one tile)
#define MM_NC 1024   // max columns of a tile (multiple of NR)

// c[0:mr][0:nr] (+)= sum_p a[p][0:MR] (outer product) b[p][0:NR]   (c has row stride ldc)
// a: packed MR-sliver (a[p*MR + i]), b: packed NR-sliver (b[p*NR + j]).
static inline void mm_micro_kernel(int kc, const float* __restrict a, const float* __restrict b,
                                   float* __restrict c, size_t ldc, int mr, int nr, bool accumulate) {
    float acc[MM_MR][MM_NR] = {};  // g++ -O3 keeps all of this in vector registers
    for (int p = 0; p < kc; p++) {
        for (int i = 0; i < MM_MR; i++) {
            float ai = a[p * MM_MR + i];
            for (int j = 0; j < MM_NR; j++) { acc[i][j] += ai * b[p * MM_NR + j]; }
        }
    }
    if (mr == MM_MR && nr == MM_NR) {  // full tile: fixed trip counts, vector stores
        for (int i = 0; i < MM_MR; i++) {
            for (int j = 0; j < MM_NR; j++) { c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + acc[i][j]; }
        }
    } else {  // edge tile: store only the valid part
        for (int i = 0; i < mr; i++) {
            for (int j = 0; j < nr; j++) { c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + acc[i][j]; }
        }
    }
}

// Packing: copy a len x kc panel X, X(i,p) = src[i*si + p*sp], into slivers of W rows:
//   dst[s*kc + p*W + i] = X(s+i, p)   for s = 0, W, 2W, ...   (0 where s+i >= len)
// so that the W values the micro-kernel needs for one p are adjacent.
// A blocks use W = MR (X = rows of A), Bm blocks use W = NR (X = columns of Bm).
static inline void mm_pack(float* dst, const float* src, size_t si, size_t sp, int len, int kc, int W) {
    if (len % W != 0) {  // zero the padding of the last, partial sliver
        memset(dst + (size_t)(len / W) * W * kc, 0, (size_t)W * kc * sizeof(float));
    }
    if (si == 1) {  // the W values are already adjacent in memory: copy pieces of each p-row
        for (int p = 0; p < kc; p++) {
            const float* x = src + p * sp;
            float* d = dst + p * W;
            int s = 0;
            for (; s + W <= len; s += W) { memcpy(d + (size_t)s * kc, x + s, W * sizeof(float)); }
            for (int i = 0; s + i < len; i++) { d[(size_t)s * kc + i] = x[s + i]; }  // partial sliver
        }
    } else {  // a transpose (X rows run along p): 16 p at a time, row after row, so that reads
              // stream along each row and writes stay in L1. We prefetch the rows' next cache
              // lines ourselves: the hardware prefetcher does not follow W streams at once.
        for (int s = 0; s < len; s += W) {
            int w = (len - s < W) ? len - s : W;
            const float* x = src + (size_t)s * si;
            for (int p0 = 0; p0 < kc; p0 += 16) {
                int p1 = (kc - p0 < 16) ? kc : p0 + 16;
                for (int i = 0; i < w; i++) {
                    __builtin_prefetch(x + i * si + (p0 + 64) * sp);
                    for (int p = p0; p < p1; p++) { dst[(size_t)s * kc + p * W + i] = x[i * si + p * sp]; }
                }
            }
        }
    }
}

// Cm (M x N, row stride ldc) = (accumulate ? Cm : 0) + A (M x K) . Bm (K x N), strided A, Bm.
static inline void gemm_blocked(int M, int N, int K, const float* A, size_t sam, size_t sak,
                                const float* Bm, size_t sbk, size_t sbn, float* Cm, size_t ldc, bool accumulate) {
    if (M <= 0 || N <= 0) { return; }
    if (K <= 0) {  // empty sum
        if (!accumulate) { for (int m = 0; m < M; m++) { for (int n = 0; n < N; n++) { Cm[m * ldc + n] = 0.0f; } } }
        return;
    }
    // Tile counts; cut N finer until every thread gets the same number of tiles.
    int tm = (M + MM_MC - 1) / MM_MC, tn = (N + MM_NC - 1) / MM_NC, tk = (K + MM_KC - 1) / MM_KC;
    int nthreads = omp_get_max_threads();
    while ((tm * tn) % nthreads != 0 && tn * MM_NR < N) { tn++; }
    // Equal tile sizes (rounded up to the register block) avoid thin leftover tiles.
    // The k blocks depend on K only, so the summation order is the same for any thread count.
    int mc = ((M + tm - 1) / tm + MM_MR - 1) / MM_MR * MM_MR;
    int nc = ((N + tn - 1) / tn + MM_NR - 1) / MM_NR * MM_NR;
    int kcmax = (K + tk - 1) / tk;
    tm = (M + mc - 1) / mc;
    tn = (N + nc - 1) / nc;
    #pragma omp parallel
    {
        // this thread's packing buffers, kept from call to call (grown when needed)
        static thread_local float* buf = NULL;
        static thread_local size_t buf_floats = 0;
        size_t need = (size_t)(mc + nc) * kcmax;
        if (need > buf_floats) {
            free(buf);
            buf = (float*)aligned_alloc(64, (need * sizeof(float) + 63) / 64 * 64);
            if (buf == NULL) { fprintf(stderr, "matmul: out of memory\n"); exit(EXIT_FAILURE); }
            buf_floats = need;
        }
        float* Ap = buf;                        // packed MC x KC block of A
        float* Bp = buf + (size_t)mc * kcmax;   // packed KC x NC block of Bm
        int packed_jt = -1;  // the tile column whose Bm block is in Bp (used when tk == 1)
        // Tiles are numbered down each tile column, and each thread gets a contiguous range
        // of them, so consecutive tiles of a thread mostly share their Bm block: with a
        // single k block (dweight: K = BT) it is packed once, not once per tile.
        #pragma omp for schedule(static)
        for (int t = 0; t < tm * tn; t++) {
            int it = t % tm, jt = t / tm;
            int m0 = it * mc, mlen = (M - m0 < mc) ? M - m0 : mc;
            int n0 = jt * nc, nlen = (N - n0 < nc) ? N - n0 : nc;
            for (int k0 = 0; k0 < K; k0 += kcmax) {
                int kc = (K - k0 < kcmax) ? K - k0 : kcmax;
                mm_pack(Ap, A + m0 * sam + k0 * sak, sam, sak, mlen, kc, MM_MR);
                if (tk > 1 || jt != packed_jt) {
                    mm_pack(Bp, Bm + n0 * sbn + k0 * sbk, sbn, sbk, nlen, kc, MM_NR);
                    packed_jt = jt;
                }
                // for each Bm sliver (stays in L1), run down all the A slivers (from L2)
                for (int jr = 0; jr < nlen; jr += MM_NR) {
                    int nr = (nlen - jr < MM_NR) ? nlen - jr : MM_NR;
                    for (int ir = 0; ir < mlen; ir += MM_MR) {
                        int mr = (mlen - ir < MM_MR) ? mlen - ir : MM_MR;
                        mm_micro_kernel(kc, Ap + (size_t)ir * kc, Bp + (size_t)jr * kc,
                                        Cm + (m0 + ir) * ldc + (n0 + jr), ldc, mr, nr, accumulate || k0 > 0);
                    }
                }
            }
        }
    }
}

static inline void matmul_forward_blocked(float* out, const float* inp, const float* weight, const float* bias,
                                          int B, int T, int C, int OC) {
    int BT = B * T;
    if (bias != NULL) {  // start from the bias and accumulate the product on top of it
        #pragma omp parallel for schedule(static)
        for (int bt = 0; bt < BT; bt++) { memcpy(out + (size_t)bt * OC, bias, (size_t)OC * sizeof(float)); }
    }
    gemm_blocked(BT, OC, C, inp, C, 1, weight, 1, C, out, OC, bias != NULL);
}

static inline void matmul_backward_blocked(float* dinp, float* dweight, float* dbias, const float* dout,
                                           const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    if (dinp != NULL) { gemm_blocked(BT, C, OC, dout, OC, 1, weight, C, 1, dinp, C, false); }  // dinp = dout . weight
    if (dweight == NULL) { return; }
    gemm_blocked(OC, C, BT, dout, 1, OC, inp, C, 1, dweight, C, true);   // dweight += dout^T . inp
    if (dbias != NULL) { matmul_bias_backward(dbias, dout, BT, OC); }
}

// ----------------------------------------------------------------------------
// OpenBLAS versions (-DLLMC_OPENBLAS): the same three products as cblas_sgemm calls.
// Threads: the pthread build of OpenBLAS has its own thread pool, and it fights OpenMP's for
// the cores: after each parallel region the OpenMP threads spin-wait a while, and OpenBLAS's
// threads then run 2-3x slower (measured for short GEMMs on 2 cores; OMP_WAIT_POLICY=passive
// cures that but slows OpenMP elsewhere). So we use only OpenMP's threads: the team cuts the
// output into slices and each thread computes its slice with a single-threaded OpenBLAS
// call. OpenBLAS thus uses the omp_get_max_threads() cores of the OpenMP team and no more
// (OMP_NUM_THREADS=1: one core in all). Deterministic: the partition is fixed.
#ifdef LLMC_OPENBLAS
// this thread's share [lo, hi) of n items, in chunks of 16 floats (one 64-byte cache line)
static inline void mm_thread_slice(int n, int* lo, int* hi) {
    int nt = omp_get_num_threads(), chunk = ((n + nt - 1) / nt + 15) / 16 * 16;
    *lo = omp_get_thread_num() * chunk;
    *hi = (*lo + chunk < n) ? *lo + chunk : n;
}

static inline void matmul_forward_openblas(float* out, const float* inp, const float* weight, const float* bias,
                                           int B, int T, int C, int OC) {
    int BT = B * T;
    openblas_set_num_threads(1);
    #pragma omp parallel
    {
        int lo, hi;
        mm_thread_slice(OC, &lo, &hi);
        if (hi > lo) {
            if (bias != NULL) {  // start from the bias, and let sgemm accumulate (beta = 1)
                for (int bt = 0; bt < BT; bt++) { memcpy(out + (size_t)bt * OC + lo, bias + lo, (hi - lo) * sizeof(float)); }
            }
            // out[:, lo:hi] (BT x n) = inp (BT x C) . weight[lo:hi, :]^T (C x n)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, hi - lo, C,
                        1.0f, inp, C, weight + (size_t)lo * C, C, bias != NULL ? 1.0f : 0.0f, out + lo, OC);
        }
    }
}

static inline void matmul_backward_openblas(float* dinp, float* dweight, float* dbias, const float* dout,
                                            const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    openblas_set_num_threads(1);
    #pragma omp parallel
    {
        int lo, hi;
        mm_thread_slice(C, &lo, &hi);
        if (hi > lo && dinp != NULL) {  // dinp[:, lo:hi] (BT x n) = dout (BT x OC) . weight[:, lo:hi] (OC x n)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, hi - lo, OC,
                        1.0f, dout, OC, weight + lo, C, 0.0f, dinp + lo, C);
        }
        mm_thread_slice(OC, &lo, &hi);
        if (hi > lo && dweight != NULL) {  // dweight[lo:hi, :] (n x C) += dout[:, lo:hi]^T (n x BT) . inp (BT x C)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, C, BT,
                        1.0f, dout + lo, OC, inp, C, 1.0f, dweight + (size_t)lo * C, C);
        }
    }
    if (dbias != NULL) { matmul_bias_backward(dbias, dout, BT, OC); }
}
#endif

// ----------------------------------------------------------------------------
// the API used by the model; the implementation is chosen at compile time

static inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                                  int B, int T, int C, int OC) {
#ifdef LLMC_OPENBLAS
    matmul_forward_openblas(out, inp, weight, bias, B, T, C, OC);
#else
    matmul_forward_blocked(out, inp, weight, bias, B, T, C, OC);
#endif
    floatx_round(out, (size_t)B * T * OC, ROUND_ACT);
}

// Either half may be skipped: dinp == NULL (no input gradient) or dweight == NULL (no weight or
// bias gradient), as the zero-bubble pipeline's B and W passes ask (llmc/model/gpt2.h).
static inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, int B, int T, int C, int OC) {
#ifdef LLMC_OPENBLAS
    matmul_backward_openblas(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
#else
    matmul_backward_blocked(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
#endif
    floatx_round(dinp, (size_t)B * T * C, ROUND_GRAD);
    floatx_round(dweight, (size_t)OC * C, ROUND_GRAD);
    floatx_round(dbias, (size_t)OC, ROUND_GRAD);
}
