// The performance part of attention (llmc/cpu/attention.h): its products, computed by blocks
// that stay in registers, and its softmax, computed 8 values at a time.
//
// Per head, every product of attention is  out(r, c) = sum_k a(r, k) * b(k, c)  over a range of
// k that depends on the row: a lower-triangular T x T matrix (P, dS) times a T x hs one (V, K,
// dO, Q), or the lower triangle of a product of two T x hs ones (the scores, dP). The register
// block (att_tile) keeps 6 rows x 16 columns of out (12 vectors of 8 floats) in registers while
// it runs over k: per k it loads two vectors of b, broadcasts 6 values of a and does 12 vector
// multiply-adds (12 independent chains hide the multiply-add's latency; with 8 the loop ran at
// 2/3 of the speed). The straight loops it replaces wrote the output row to memory at every k
// and reduced every dot product of hs terms across the vector lanes. The scores need the keys
// as columns: the caller transposes them first (att_transpose).
//
// Order of the sums: every output element of a product is ONE chain of multiply-adds over k in
// increasing order, from 0, whatever the block it is in and whatever the other rows of the
// block; the softmax of a row depends on that row only. So no number depends on how the rows
// are grouped: the KV cache (one query at a time) gets the training forward's numbers, and the
// thread count changes nothing. The sums across a row (softmax, att_dot) go in 8 lanes, then
// the lanes pairwise: an order fixed here, not left to the vectoriser.
// Plain C++ with GCC vector types (no intrinsics): the vectors of 8 floats are AVX2's ymm
// registers; the compiler splits them where vectors are narrower.
#pragma once

#include <math.h>
#include <string.h>
#include "exp_poly.h"

#define ATT_MR 6    // rows of the register block
#define ATT_NR 16   // columns of the register block: two vectors
typedef float att_vec __attribute__((vector_size(8 * sizeof(float)), aligned(4)));
typedef int att_ivec __attribute__((vector_size(8 * sizeof(int))));

// 8 floats at p as a vector (unaligned: aligned(4)). Vectors go to and from functions by
// reference: by value, their ABI would depend on -mavx (g++ -Wpsabi, in builds without it).
static inline const att_vec& att_load(const float* p) { return *(const att_vec*)p; }
static inline void att_store(float* p, const att_vec& v) { *(att_vec*)p = v; }

// Rows of keys or scores are padded to whole register blocks: att_padded(n) floats hold n.
static inline int att_padded(int n) { return (n + ATT_NR - 1) / ATT_NR * ATT_NR; }

// dst[i * ldd + j] = src[j * lds + i] for i < hs, j < n; 0 for n <= j < ldd
static inline void att_transpose(float* dst, int ldd, const float* src, size_t lds, int n, int hs) {
    for (int i = 0; i < hs; i++) {
        float* d = dst + (size_t)i * ldd;
        for (int j = 0; j < n; j++) { d[j] = src[(size_t)j * lds + i]; }
        for (int j = n; j < ldd; j++) { d[j] = 0.0f; }
    }
}

// Loads one float of every 64 bytes of the n rows of w floats at x, x + ld, ..., and drops them:
// the loads do not depend on each other, so the lines come from memory in parallel, before the
// loops that need them. A head's slices of the rows of q | k | v (128 of every 1536 bytes in the
// default model) are strided reads the hardware prefetchers do not follow, and the transposes'
// loads waited for them one row at a time. (__builtin_prefetch of the next head did no better.)
static inline void att_touch(const float* x, size_t ld, int n, int w) {
    unsigned bits = 0;
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < w; c += 16) {
            unsigned u;
            memcpy(&u, x + i * ld + c, sizeof(u));
            bits |= u;
        }
    }
    volatile unsigned keep = bits;   // so that the compiler keeps the loads
    (void)keep;
}

// One row of the register block: (y0, y1) += x * b[0 .. 8 NV)   (y1 unused when NV = 1)
template <int NV>
static inline void att_fma(att_vec& y0, att_vec& y1, float x, const float* b) {
    y0 += x * att_load(b);
    if (NV == 2) { y1 += x * att_load(b + 8); }
}

// o[0 .. 8 NV) = scale * (y0, y1)
template <int NV>
static inline void att_store_row(float* o, const att_vec& y0, const att_vec& y1, float scale) {
    att_store(o, y0 * scale);
    if (NV == 2) { att_store(o + 8, y1 * scale); }
}

// The register block: for the rows r < nr (at most 6) and the 8 NV columns c (NV = 1 or 2),
//   out[r * ldo + c] = scale * sum_{kb[r] <= k < ke[r]} a[r * sar + k * sak] * b[k * ldb + c]
// kb and ke must not decrease with r. The k ranges overlap on [kb[nr-1], ke[0]) (not empty):
// there the rows run together; before it rows 0..nr-2 run alone (from kb[r]), after it rows
// 1..nr-1 (to ke[r]): so every element is the chain k = kb[r] .. ke[r]-1 in order. Rows nr..5
// repeat row 0 and are not stored. The 12 accumulators are named vectors, not an array, so
// that the compiler keeps them in registers (an array went through memory between the loops).
template <int NV>
static inline void att_tile(float* out, size_t ldo, int nr, const float* a, size_t sar, size_t sak,
                            const float* b, size_t ldb, const int* kb, const int* ke, float scale) {
    const float* a0 = a;   // the rows of a (past nr: row 0 again)
    const float* a1 = nr > 1 ? a + sar : a;
    const float* a2 = nr > 2 ? a + 2 * sar : a;
    const float* a3 = nr > 3 ? a + 3 * sar : a;
    const float* a4 = nr > 4 ? a + 4 * sar : a;
    const float* a5 = nr > 5 ? a + 5 * sar : a;
    int k0 = kb[nr - 1], k1 = ke[0];   // the common range
    att_vec y00 = {}, y01 = {}, y10 = {}, y11 = {}, y20 = {}, y21 = {};
    att_vec y30 = {}, y31 = {}, y40 = {}, y41 = {}, y50 = {}, y51 = {};
    for (int k = kb[0]; k < k0; k++) { att_fma<NV>(y00, y01, a0[k * sak], b + k * ldb); }   // before it
    if (nr > 1) { for (int k = kb[1]; k < k0; k++) { att_fma<NV>(y10, y11, a1[k * sak], b + k * ldb); } }
    if (nr > 2) { for (int k = kb[2]; k < k0; k++) { att_fma<NV>(y20, y21, a2[k * sak], b + k * ldb); } }
    if (nr > 3) { for (int k = kb[3]; k < k0; k++) { att_fma<NV>(y30, y31, a3[k * sak], b + k * ldb); } }
    if (nr > 4) { for (int k = kb[4]; k < k0; k++) { att_fma<NV>(y40, y41, a4[k * sak], b + k * ldb); } }
    for (int k = k0; k < k1; k++) {   // the common range: 2 loads, 6 broadcasts, 12 multiply-adds
        const float* bk = b + k * ldb;
        att_fma<NV>(y00, y01, a0[k * sak], bk);
        att_fma<NV>(y10, y11, a1[k * sak], bk);
        att_fma<NV>(y20, y21, a2[k * sak], bk);
        att_fma<NV>(y30, y31, a3[k * sak], bk);
        att_fma<NV>(y40, y41, a4[k * sak], bk);
        att_fma<NV>(y50, y51, a5[k * sak], bk);
    }
    if (nr > 1) { for (int k = k1; k < ke[1]; k++) { att_fma<NV>(y10, y11, a1[k * sak], b + k * ldb); } }   // after it
    if (nr > 2) { for (int k = k1; k < ke[2]; k++) { att_fma<NV>(y20, y21, a2[k * sak], b + k * ldb); } }
    if (nr > 3) { for (int k = k1; k < ke[3]; k++) { att_fma<NV>(y30, y31, a3[k * sak], b + k * ldb); } }
    if (nr > 4) { for (int k = k1; k < ke[4]; k++) { att_fma<NV>(y40, y41, a4[k * sak], b + k * ldb); } }
    if (nr > 5) { for (int k = k1; k < ke[5]; k++) { att_fma<NV>(y50, y51, a5[k * sak], b + k * ldb); } }
    att_store_row<NV>(out, y00, y01, scale);
    if (nr > 1) { att_store_row<NV>(out + ldo, y10, y11, scale); }
    if (nr > 2) { att_store_row<NV>(out + 2 * ldo, y20, y21, scale); }
    if (nr > 3) { att_store_row<NV>(out + 3 * ldo, y30, y31, scale); }
    if (nr > 4) { att_store_row<NV>(out + 4 * ldo, y40, y41, scale); }
    if (nr > 5) { att_store_row<NV>(out + 5 * ldo, y50, y51, scale); }
}

// The hs columns of a block of rows: 16 at a time, then 8, then one at a time (the same chains).
static inline void att_columns(float* out, size_t ldo, int nr, const float* a, size_t sar, size_t sak,
                               const float* x, size_t ldx, const int* kb, const int* ke, int hs) {
    int c = 0;
    for (; c + ATT_NR <= hs; c += ATT_NR) { att_tile<2>(out + c, ldo, nr, a, sar, sak, x + c, ldx, kb, ke, 1.0f); }
    if (c + 8 <= hs) { att_tile<1>(out + c, ldo, nr, a, sar, sak, x + c, ldx, kb, ke, 1.0f); c += 8; }
    for (; c < hs; c++) {
        for (int r = 0; r < nr; r++) {
            float s = 0.0f;
            for (int k = kb[r]; k < ke[r]; k++) { s += a[r * sar + k * sak] * x[k * ldx + c]; }
            out[r * ldo + c] = s;
        }
    }
}

// The lower triangle of scale A B^T, for the rows r < nq of A (row r: position t0 + r):
//   s[r * lds + j] = scale * sum_{i < hs} a[r * lda + i] * bt[i * ldbt + j]     for j <= t0 + r
// bt: B transposed, with ldbt >= att_padded(t0 + nq) columns (zero past the keys). Whole blocks
// of 8 or 16 columns are written: s must have att_padded(t0 + nq) columns; past t0 + r they hold
// scores of the later (or padding) keys.
static inline void att_lower_abt(float* s, size_t lds, const float* a, size_t lda, const float* bt, int ldbt,
                                 int t0, int nq, int hs, float scale) {
    int kb[ATT_MR], ke[ATT_MR];
    for (int r = 0; r < ATT_MR; r++) { kb[r] = 0; ke[r] = hs; }
    for (int r0 = 0; r0 < nq; r0 += ATT_MR) {
        int nr = nq - r0 < ATT_MR ? nq - r0 : ATT_MR, nkeys = t0 + r0 + nr;   // up to the block's last row
        for (int j0 = 0; j0 < nkeys; j0 += ATT_NR) {
            float* sj = s + r0 * lds + j0;
            if (nkeys - j0 <= 8) {   // the last 8 keys or fewer: one vector
                att_tile<1>(sj, lds, nr, a + r0 * lda, lda, 1, bt + j0, ldbt, kb, ke, scale);
            } else {
                att_tile<2>(sj, lds, nr, a + r0 * lda, lda, 1, bt + j0, ldbt, kb, ke, scale);
            }
        }
    }
}

// L X with L lower triangular, for the rows r < nq of L (row r: position t0 + r):
//   o[r * ldo + c] = sum_{k <= t0 + r} w[r * ldw + k] * x[k * ldx + c]     for c < hs
static inline void att_lower_mul(float* o, size_t ldo, const float* w, size_t ldw, const float* x, size_t ldx,
                                 int t0, int nq, int hs) {
    for (int r0 = 0; r0 < nq; r0 += ATT_MR) {
        int nr = nq - r0 < ATT_MR ? nq - r0 : ATT_MR, kb[ATT_MR], ke[ATT_MR];
        for (int r = 0; r < ATT_MR; r++) { kb[r] = 0; ke[r] = t0 + r0 + r + 1; }
        att_columns(o + r0 * ldo, ldo, nr, w + r0 * ldw, ldw, 1, x, ldx, kb, ke, hs);
    }
}

// L^T X with L (T x T) lower triangular:
//   y[j * ldy + c] = sum_{j <= k < T} w[k * ldw + j] * x[k * ldx + c]     for j < T, c < hs
static inline void att_lower_tmul(float* y, size_t ldy, const float* w, size_t ldw, const float* x, size_t ldx,
                                  int T, int hs) {
    for (int j0 = 0; j0 < T; j0 += ATT_MR) {
        int nr = T - j0 < ATT_MR ? T - j0 : ATT_MR, kb[ATT_MR], ke[ATT_MR];
        for (int r = 0; r < ATT_MR; r++) { kb[r] = j0 + r; ke[r] = T; }
        att_columns(y + j0 * ldy, ldy, nr, w + j0, 1, ldw, x, ldx, kb, ke, hs);
    }
}

// The lanes of a vector added pairwise: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
static inline float att_lanes_sum(const att_vec& v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// p[0..n) = softmax(p[0..n)) in place, with exp_poly. p must have (n + 7) / 8 * 8 floats, all
// set (past n: any finite values; they are overwritten): the loops run over whole vectors, as a
// scalar remainder of exp_poly would cost more than the vectors. The sum: lane i adds p[i],
// p[i + 8], ... in order, then the lanes pairwise; the max is exact in any order.
static inline void att_softmax(float* p, int n) {
    int last = (n - 1) / 8 * 8;   // the last group of 8, partial or not
    att_ivec lane = {0, 1, 2, 3, 4, 5, 6, 7};
    att_ivec inside = lane < n - last;
    att_vec neg_inf = {}, zero = {};
    neg_inf -= INFINITY;
    att_vec m = inside ? att_load(p + last) : neg_inf;
    for (int j = 0; j < last; j += 8) { att_vec x = att_load(p + j); m = x > m ? x : m; }
    float maxval = m[0];
    for (int i = 1; i < 8; i++) { maxval = m[i] > maxval ? m[i] : maxval; }
    for (int j = 0; j < last + 8; j++) { p[j] = exp_poly(p[j] - maxval); }
    att_vec sum = zero;
    for (int j = 0; j < last; j += 8) { sum += att_load(p + j); }
    sum += inside ? att_load(p + last) : zero;
    att_vec inv = zero + 1.0f / att_lanes_sum(sum);
    for (int j = 0; j <= last; j += 8) { att_store(p + j, att_load(p + j) * inv); }
}

// sum_{j < n} x[j] * y[j]: lane i adds x[i] y[i], x[i + 8] y[i + 8], ... in order, then the
// lanes pairwise, then the last n % 8 products one by one
static inline float att_dot(const float* x, const float* y, int n) {
    att_vec acc = {};
    int j = 0;
    for (; j + 8 <= n; j += 8) { acc += att_load(x + j) * att_load(y + j); }
    float s = att_lanes_sum(acc);
    for (; j < n; j++) { s += x[j] * y[j]; }
    return s;
}
