// Gradient compression's codec: what a rank sends in place of a gradient bucket, C(a), and
// what the others make of it, d = D(C(a)); host functions on fp32 arrays (unit-tested in
// test/test_compress.cu). The data-parallel wiring is dp_compress.h.
//
// The methods (n values of the bucket, a the values to send, d = D(C(a)) what arrives):
//   topk:R   k = ceil(R n) values of largest |a| (ties: the lower index), sent as k fp32 values
//            and k int32 indices:                          8 k bytes
//   randk:R  k = ceil(R n) indices drawn without replacement from a seed every rank shares for
//            the (bucket, step): the indices are never sent, k fp32 values: 4 k bytes
//            (not rescaled by n/k: with error feedback nothing is lost; without it the
//            expected sent gradient is R a, a smaller step, which Adam's normalisation undoes)
//   qsgd:B   stochastic rounding to a grid of step h, a power of two, with L = 2^(B-1) - 1
//            magnitude levels (B = 1: the two points -h, +h):
//              h = 2^ceil(log2(max|a| / L)), so L h >= max|a|;  c = |a| / h, l = floor(c)
//              |d| = (l + 1) h with probability c - l, else l h;  d has a's sign
//            unbiased: E[d] = a;  Var[d] = h^2 (c - l)(l + 1 - c)  (B = 1: h^2 - a^2)
//            sign + B-1 bits per value, packed, and h:  4 (1 + ceil(n B / 32)) bytes
//   sign     d = s sign(a) with s = sum |a| / n (signSGD with a scale; 1-bit Adam's compression;
//            sign(0) = +): 1 bit per value and s:      4 (1 + ceil(n / 32)) bytes
//
// Error feedback (per rank and bucket, a residual e of n fp32 values, starting at -0, the
// additive identity: x + -0 = x for every x, so a = g bit for bit when nothing is kept):
//   topk, randk   a value is sent whole (e = -0) or kept whole (e = a): exact by construction
//   qsgd          e = a - d is exact (Sterbenz: d/2 <= a <= 2d) except when c < 1/2 rounds up
//                 to h; then (TwoSum finds a - d inexact) the value rounds down instead (d = 0,
//                 e = a). That bias (E[d] = 0 instead of a, |a| < h/2) goes into the residual,
//                 not lost; without error feedback there is no residual and no guard.
//   sign, qsgd:1  (d = +-s or +-h whatever |a|) a - d with |a| << s cannot be exact in
//                 fp32. Checked: e == fl(a - d) and
//                 |a - (d + e)| <= ulp(e)/2, the error measured exactly with TwoSum.
// The check runs every step on every value and is printed under the step's comm line
// ("error feedback: sent + residual = accumulated exactly on all ... values"). The
// accumulation a = g + e itself rounds, like any fp32 sum of gradients (micro-steps do too).
//
// Randomness: QSGD's draws per (rank, bucket, step); randk's indices per (bucket, step), the
// same on every rank. The residuals are not saved in the training state (a resumed run starts
// with e = 0) and the step counter restarts with it.
#pragma once

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "../common.h"
#include "../rand.h"

enum { CMP_TOPK, CMP_RANDK, CMP_QSGD, CMP_SIGN };
static const char* CMP_NAMES[4] = {"topk", "randk", "qsgd", "sign"};

typedef struct {
    int method;     // CMP_*
    double ratio;   // topk, randk: the fraction of values sent
    int bits;       // qsgd
} CompressSpec;

// "topk:R" ... as train_args_check_ps accepted it
static inline CompressSpec compress_parse(const char* s) {
    CompressSpec c = {CMP_SIGN, 1.0, 1};
    const char* colon = strchr(s, ':');
    if (strncmp(s, "topk:", 5) == 0) { c.method = CMP_TOPK; }
    else if (strncmp(s, "randk:", 6) == 0) { c.method = CMP_RANDK; }
    else if (strncmp(s, "qsgd:", 5) == 0) { c.method = CMP_QSGD; }
    else if (strcmp(s, "sign") != 0) { die("--compress must be none, topk:R, randk:R, qsgd:B or sign, got '%s'", s); }
    if (c.method == CMP_TOPK || c.method == CMP_RANDK) { c.ratio = atof(colon + 1); }
    if (c.method == CMP_QSGD) { c.bits = atoi(colon + 1); }
    if (!(c.ratio > 0.0 && c.ratio <= 1.0) || c.bits < 1 || c.bits > 16) { die("--compress '%s': ratio or bits out of range", s); }
    return c;
}

// ---------------------------------------------------------------------------------------
// The codec

// values sent by the sparse methods: ceil(R n), at least 1 (n > 0)
static inline size_t cmp_k(const CompressSpec* s, size_t n) {
    if (n == 0) { return 0; }
    size_t k = (size_t)ceil(s->ratio * (double)n);
    return std::min(n, std::max((size_t)1, k));
}
// payload of a bucket of n values, in 32-bit words
static inline size_t cmp_payload_words(const CompressSpec* s, size_t n) {
    switch (s->method) {
        case CMP_TOPK: return 2 * cmp_k(s, n);                      // values, indices
        case CMP_RANDK: return cmp_k(s, n);                         // values (indices from the seed)
        case CMP_QSGD: return 1 + ceil_div(n * (size_t)s->bits, (size_t)32);   // h, codes
        default: return 1 + ceil_div(n, (size_t)32);                // s, sign bits
    }
}
static inline int cmp_sparse(const CompressSpec* s) { return s->method == CMP_TOPK || s->method == CMP_RANDK; }
// QSGD's magnitude levels L (B = 1: one level, the points -h and +h)
static inline int cmp_levels(int bits) { return bits == 1 ? 1 : (1 << (bits - 1)) - 1; }

// TwoSum (Knuth): x + y = s + err exactly, s = fl(x + y), in round-to-nearest
static inline float cmp_two_sum(float x, float y, float* err) {
    float s = x + y, yv = s - x;
    *err = (x - (s - yv)) + (y - yv);
    return s;
}
static inline float cmp_ulp(float x) {
    x = fabsf(x);
    return nextafterf(x, INFINITY) - x;
}

// top-k: the k indices of largest |a| (ties: lower index first), ascending, into idx;
// scratch holds n indices
static inline void cmp_topk_select(const float* a, size_t n, size_t k, uint32_t* idx, uint32_t* scratch) {
    for (size_t i = 0; i < n; i++) { scratch[i] = (uint32_t)i; }
    auto key = [a](uint32_t i) { float v = fabsf(a[i]); return v != v ? INFINITY : v; };   // NaN first
    auto larger = [&key](uint32_t x, uint32_t y) {
        float kx = key(x), ky = key(y);
        return kx > ky || (kx == ky && x < y);
    };
    if (k < n) { std::nth_element(scratch, scratch + k, scratch + n, larger); }
    memcpy(idx, scratch, k * sizeof(uint32_t));
    std::sort(idx, idx + k);
}

// random-k: k distinct indices of [0, n) from the seed (a partial Fisher-Yates shuffle), ascending
static inline void cmp_randk_select(size_t n, size_t k, uint64_t seed, uint32_t* idx, uint32_t* scratch) {
    Rng rng;
    rng_init(&rng, seed);
    for (size_t i = 0; i < n; i++) { scratch[i] = (uint32_t)i; }
    for (size_t j = 0; j < k && k < n; j++) {
        size_t pick = j + (size_t)(((uint64_t)rng_u32(&rng) * (uint64_t)(n - j)) >> 32);
        std::swap(scratch[j], scratch[pick]);
    }
    memcpy(idx, scratch, k * sizeof(uint32_t));
    std::sort(idx, idx + k);
}

// uniform in [0, 1) with 53 random bits
static inline double cmp_uniform53(Rng* r) {
    uint64_t hi = rng_u32(r), lo = rng_u32(r);
    return (double)(((hi << 21) ^ (lo >> 11)) & ((1ull << 53) - 1)) / 9007199254740992.0;
}

// QSGD's grid step: the smallest power of two h with L h >= amax (0 when amax is 0; NaN when a
// value is not finite: every decoded value is then NaN, and the trainer's check of the
// gradient norm reports the divergence as it does without compression)
static inline float cmp_qsgd_step(float amax, int bits) {
    if (amax == 0.0f) { return 0.0f; }
    if (!isfinite(amax)) { return NAN; }
    int L = cmp_levels(bits), e;
    double m = frexp((double)amax / L, &e);                 // amax / L = m 2^e, m in [0.5, 1)
    float h = ldexpf(1.0f, m == 0.5 ? e - 1 : e);
    if (h == 0.0f) { h = ldexpf(1.0f, -149); }              // below the smallest denormal
    if ((double)L * h < amax) { h *= 2.0f; }                // (never: the division cannot round to a power of two)
    return h;
}

// code of element i: B bits at bit i B of the word stream (little end first)
static inline void cmp_put_bits(uint32_t* w, size_t i, int bits, uint32_t code) {
    size_t bit = i * (size_t)bits, word = bit / 32, off = bit % 32;
    w[word] |= code << off;
    if (off + bits > 32) { w[word + 1] |= code >> (32 - off); }
}
static inline uint32_t cmp_get_bits(const uint32_t* w, size_t i, int bits) {
    size_t bit = i * (size_t)bits, word = bit / 32, off = bit % 32;
    uint64_t v = w[word] >> off;
    if (off + bits > 32) { v |= (uint64_t)w[word + 1] << (32 - off); }
    return (uint32_t)(v & ((1u << bits) - 1));
}
static inline float cmp_word_float(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t cmp_float_word(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

// decoded value of QSGD code c (sign bit on top, then the level)
static inline float cmp_qsgd_value(uint32_t c, int bits, float h) {
    uint32_t sign = c >> (bits - 1);
    float mag = bits == 1 ? 1.0f : (float)(c & ((1u << (bits - 1)) - 1));
    return sign ? -(mag * h) : mag * h;
}

// QSGD: a (n values) into out (cmp_payload_words words). guard: round down where a - d would
// be inexact (error feedback's exactness). Returns how many values the guard rounded down.
static inline size_t cmp_qsgd_encode(const float* a, size_t n, int bits, uint64_t seed, int guard, uint32_t* out) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) { amax = isfinite(a[i]) ? std::max(amax, fabsf(a[i])) : INFINITY; }
    float h = cmp_qsgd_step(amax, bits);
    size_t words = 1 + ceil_div(n * (size_t)bits, (size_t)32), guarded = 0;
    memset(out, 0, words * sizeof(uint32_t));
    out[0] = cmp_float_word(h);
    uint32_t* codes = out + 1;
    Rng rng;
    rng_init(&rng, seed);
    int L = cmp_levels(bits);
    for (size_t i = 0; i < n; i++) {
        double u = cmp_uniform53(&rng);   // drawn for every value: the stream does not depend on a
        if (h == 0.0f || h != h) { continue; }   // all zero: code 0 is +0; NaN: every value NaN
        uint32_t neg = a[i] < 0.0f || (a[i] == 0.0f && signbit(a[i]));
        uint32_t code;
        if (bits == 1) {
            // two points -h, +h: P(+h) = (1 + a/h) / 2, E[d] = a
            int up = u < 0.5 + 0.5 * ((double)a[i] / h);
            neg = !up;
            code = neg;
        } else {
            double c = fabs((double)a[i]) / h;   // exact: h is a power of two
            double l = floor(c);
            uint32_t m = (uint32_t)l + (u < c - l ? 1u : 0u);
            if (m > (uint32_t)L) { m = (uint32_t)L; }   // never: |a| <= L h
            code = (neg << (bits - 1)) | m;
        }
        if (guard && bits > 1) {
            float d = cmp_qsgd_value(code, bits, h), err;
            cmp_two_sum(a[i], -d, &err);
            if (err != 0.0f) {   // a - d not representable: round toward zero instead
                code = neg << (bits - 1) | (uint32_t)floor(fabs((double)a[i]) / h);
                guarded++;
            }
        }
        cmp_put_bits(codes, i, bits, code);
    }
    return guarded;
}

// sign: s = mean |a| and one bit per value (1: negative)
static inline void cmp_sign_encode(const float* a, size_t n, uint32_t* out) {
    double l1 = 0.0;
    for (size_t i = 0; i < n; i++) { l1 += fabs((double)a[i]); }
    size_t words = 1 + ceil_div(n, (size_t)32);
    memset(out, 0, words * sizeof(uint32_t));
    out[0] = cmp_float_word(n ? (float)(l1 / (double)n) : 0.0f);   // not finite with a value that is not: d too
    for (size_t i = 0; i < n; i++) {
        if (a[i] < 0.0f) { out[1 + i / 32] |= 1u << (i % 32); }
    }
}

// Encode a (n values) into out. idx: the sparse methods' selected indices, chosen here (topk: by
// magnitude; randk: from seed, which every rank passes the same), scratch: n indices. qsgd:
// seed draws the rounding (each rank its own). Returns the guarded count (qsgd).
static inline size_t cmp_encode(const CompressSpec* s, const float* a, size_t n, uint64_t seed, int guard, uint32_t* out,
                                uint32_t* idx, uint32_t* scratch) {
    if (cmp_sparse(s)) {
        size_t k = cmp_k(s, n);
        if (s->method == CMP_TOPK) {
            cmp_topk_select(a, n, k, idx, scratch);
            for (size_t j = 0; j < k; j++) { out[k + j] = idx[j]; }
        } else {
            cmp_randk_select(n, k, seed, idx, scratch);
        }
        for (size_t j = 0; j < k; j++) { out[j] = cmp_float_word(a[idx[j]]); }
        return 0;
    }
    if (s->method == CMP_QSGD) { return cmp_qsgd_encode(a, n, s->bits, seed, guard, out); }
    cmp_sign_encode(a, n, out);
    return 0;
}

// Decode elements [lo, hi) of a bucket of n values from payload p into out[0 .. hi-lo).
// idx: randk's indices (shared); topk's come with the payload.
static inline void cmp_decode(const CompressSpec* s, const uint32_t* p, size_t n, const uint32_t* idx, size_t lo,
                              size_t hi, float* out) {
    if (cmp_sparse(s)) {
        size_t k = cmp_k(s, n);
        const uint32_t* ix = s->method == CMP_TOPK ? p + k : idx;
        for (size_t i = lo; i < hi; i++) { out[i - lo] = 0.0f; }
        size_t j = std::lower_bound(ix, ix + k, (uint32_t)lo) - ix;
        for (; j < k && ix[j] < hi; j++) { out[ix[j] - lo] = cmp_word_float(p[j]); }
    } else if (s->method == CMP_QSGD) {
        float h = cmp_word_float(p[0]);
        for (size_t i = lo; i < hi; i++) { out[i - lo] = cmp_qsgd_value(cmp_get_bits(p + 1, i, s->bits), s->bits, h); }
    } else {
        float sc = cmp_word_float(p[0]);
        for (size_t i = lo; i < hi; i++) { out[i - lo] = (p[1 + i / 32] >> (i % 32)) & 1u ? -sc : sc; }
    }
}

// sign and qsgd:1 put a value on +-s whatever its size: a - d is not always an fp32 number
static inline int cmp_exact(const CompressSpec* s) { return s->method != CMP_SIGN && !(s->method == CMP_QSGD && s->bits == 1); }

// Error feedback's residual e = a - d (d decoded from the payload; idx: the sparse methods'
// sent indices), and the conservation check on every value:
//   exact methods: fl(d + e) == a with no rounding error (TwoSum)
//   sign, qsgd:1:  e == fl(a - d) and |a - (d + e)| <= ulp(e)/2 (the error, by TwoSum, exact)
// Returns the number of values that pass; *max_err: the largest |a - (d + e)| (sign, qsgd:1).
static inline size_t cmp_residual(const CompressSpec* s, const float* a, const float* d, const uint32_t* idx, float* e,
                                  size_t n, float* max_err) {
    size_t ok = 0;
    if (cmp_sparse(s)) {   // kept whole (e = a), or sent whole (e = -0)
        memcpy(e, a, n * sizeof(float));
        for (size_t j = 0; j < cmp_k(s, n); j++) { e[idx[j]] = -0.0f; }
    } else {
        for (size_t i = 0; i < n; i++) { e[i] = a[i] - d[i]; }
    }
    for (size_t i = 0; i < n; i++) {
        float err;
        if (!cmp_exact(s)) {
            float diff = cmp_two_sum(a[i], -d[i], &err);   // a - d = diff + err exactly
            if (e[i] == diff && fabsf(err) <= 0.5f * cmp_ulp(e[i])) { ok++; }
            *max_err = std::max(*max_err, fabsf(err));
        } else {
            float sum = cmp_two_sum(d[i], e[i], &err);
            if (sum == a[i] && err == 0.0f) { ok++; }
        }
    }
    return ok;
}

// the seed of a (bucket, step, rank)'s random draws
static inline uint64_t cmp_seed(uint64_t bucket, uint64_t step, uint64_t rank) {
    return 0x243F6A8885A308D3ull ^ (bucket * 0x9E3779B97F4A7C15ull) ^ (step * 0xBF58476D1CE4E5B9ull) ^ (rank * 0x94D049BB133111EBull);
}
