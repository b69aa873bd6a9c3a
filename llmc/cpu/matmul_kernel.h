// The performance part of the linear layers (llmc/cpu/matmul.h): our GEMM's cache-blocked, packed,
// register-blocked kernel (the BLIS / GotoBLAS recipe), and the bias gradient's column sums.
//
// Register block: the micro-kernel keeps an MR x NR tile of Cm in registers while it runs
// over kc values of k. Per k it loads NR floats of Bm (two vectors: 2 x 16 floats with
// AVX-512, 2 x 8 with AVX2), broadcasts MR = 6 floats of A and does 12 vector FMAs: 12
// independent accumulators hide the FMA latency, 2 loads + 6 broadcasts feed 12 FMAs, and
// 12 + 2 + 1 registers fit even AVX2's 16. (A 3x32 AVX2 block needs 17 and reloads Bm from
// memory at every FMA: 15-20% slower on Zen 3.) On one Zen 5 core this loop runs at ~98% of the FMA peak.
// Cache blocks: k is cut in pieces of KC. A KC x NR sliver of Bm (<= 32 KiB) stays in the
// L1 cache while the MR-row slivers of an MC x KC block of A (<= 264 KiB, kept in
// L2) stream past it. Bm's blocks are *packed* first: copied into contiguous buffers in the
// order the micro-kernel reads them (doing the transposes, zero-padding partial slivers). A is
// read in place where a stride is 1 (matmul.h); only its last, partial sliver is packed.
// Threads: the output is cut in MC x NC tiles; each tile belongs to one thread.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#define MM_MR 6      // rows of the register block
#ifdef __AVX512F__
#define MM_NR 32     // columns of the register block: two 16-float zmm vectors
#else
#define MM_NR 16     // AVX2: two 8-float ymm vectors
#endif
typedef float mm_vec __attribute__((vector_size(MM_NR / 2 * sizeof(float)), aligned(4)));   // half a row of the block
#define MM_KC 256    // depth of a packed block
#define MM_MC 264    // max rows of a tile (multiple of MR; >= 256 so BT=256 is one tile)
#define MM_NC 1024   // max columns of a tile (multiple of NR)

// The tiles of an M x N product with a K-long sum: tm x tn tiles of mc x nc (the last ones
// smaller), the sum in tk blocks of at most kcmax. N is cut finer until every thread gets the
// same number of tiles; equal tile sizes (rounded up to the register block) avoid thin leftover
// tiles. The k blocks depend on K only, so the summation order is the same for any thread count.
typedef struct { int tm, tn, tk, mc, nc, kcmax; } MMTiles;
static inline MMTiles mm_tiles(int M, int N, int K) {
    int tm = (M + MM_MC - 1) / MM_MC, tn = (N + MM_NC - 1) / MM_NC, tk = (K + MM_KC - 1) / MM_KC;
    int nthreads = omp_get_max_threads();
    while ((tm * tn) % nthreads != 0 && tn * MM_NR < N) { tn++; }
    int mc = ((M + tm - 1) / tm + MM_MR - 1) / MM_MR * MM_MR;
    int nc = ((N + tn - 1) / tn + MM_NR - 1) / MM_NR * MM_NR;
    int kcmax = (K + tk - 1) / tk;
    MMTiles t = {(M + mc - 1) / mc, (N + nc - 1) / nc, tk, mc, nc, kcmax};
    return t;
}

// c[0:mr][0:nr] (+)= sum_p a[p][0:MR] (outer product) b[p][0:NR]   (c has row stride ldc)
// a: MR-sliver, A(i, p) = a[i*ars + p*acs]: packed (ars = 1, acs = MR) or read in place (A's own
// strides); b: packed NR-sliver (b[p*NR + j]). Not accumulating, c starts from start[0:nr] in
// every row (the forward's bias), or from 0 when start is NULL.
static inline void mm_micro_kernel(int kc, const float* __restrict a, size_t ars, size_t acs, const float* __restrict b,
                                   float* __restrict c, size_t ldc, int mr, int nr, bool accumulate,
                                   const float* __restrict start) {
    mm_vec acc_v[MM_MR][2] = {};   // the 12 accumulators (g++ -O3 keeps them in registers)
    const float* ar[MM_MR];        // the MR rows of A
    for (int i = 0; i < MM_MR; i++) { ar[i] = a + i * ars; }
    for (int i = 0; i < mr; i++) {   // ask for c's lines now: they arrive while the loop below runs
        __builtin_prefetch(c + i * ldc, 1);
        __builtin_prefetch(c + i * ldc + nr - 1, 1);
    }
    for (int p = 0; p < kc; p++) {
        mm_vec b0 = *(const mm_vec*)(b + p * MM_NR), b1 = *(const mm_vec*)(b + p * MM_NR + MM_NR / 2);
        for (int i = 0; i < MM_MR; i++) {
            float ai = ar[i][p * acs];     // one value of A times a row of Bm: 2 FMAs
            acc_v[i][0] += ai * b0;
            acc_v[i][1] += ai * b1;
        }
    }
    float acc[MM_MR][MM_NR];
    memcpy(acc, acc_v, sizeof(acc));
    float s0[MM_NR] = {};   // what c starts from when not accumulating
    if (!accumulate && start != NULL) { for (int j = 0; j < nr; j++) { s0[j] = start[j]; } }
    if (mr == MM_MR && nr == MM_NR) {  // full tile: fixed trip counts, vector stores
        for (int i = 0; i < MM_MR; i++) {
            for (int j = 0; j < MM_NR; j++) { c[i * ldc + j] = (accumulate ? c[i * ldc + j] : s0[j]) + acc[i][j]; }
        }
    } else {  // edge tile: store only the valid part
        for (int i = 0; i < mr; i++) {
            for (int j = 0; j < nr; j++) { c[i * ldc + j] = (accumulate ? c[i * ldc + j] : s0[j]) + acc[i][j]; }
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

// This thread's packing buffers for `need` floats, kept from call to call (grown when needed).
static inline float* mm_thread_buffer(size_t need) {
    static thread_local float* buf = NULL;
    static thread_local size_t buf_floats = 0;
    if (need > buf_floats) {
        free(buf);
        buf = (float*)aligned_alloc(64, (need * sizeof(float) + 63) / 64 * 64);
        if (buf == NULL) { fprintf(stderr, "matmul: out of memory\n"); exit(EXIT_FAILURE); }
        buf_floats = need;
    }
    return buf;
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
