// Gradient compression (--compress topk:R | randk:R | qsgd:B | sign, --error-feedback on|off):
// each rank sends a compressed copy C(a) of its gradient bucket instead of the bucket, for the
// data-parallel all-reduce (--dp-mode naive: one bucket, the flat buffer; --dp-mode ddp --zero 0:
// one per DDP bucket) and for the parameter server's push (--dp-mode ps: a bucket per server
// slice; the pull of parameters is not compressed).
//
//   all-reduce of a bucket of n values, N ranks          parameter-server push, S servers
//     a_r = g_r + e_r        (error feedback)              a_r = g_r + e_r per slice s
//     P_r = C(a_r)           (the payload, words)          P_r,s = C(a_r,s)
//     all-gather P_0 .. P_{N-1}  (ring, counted)           worker r -> server s: P_r,s (s != r)
//     every rank: sum_j D(P_j) / N                         server s: sum_j D(P_j,s) / N
//     e_r = a_r - D(P_r)     (kept for the next step)      e_r,s = a_r,s - D(P_r,s)
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
// Bytes this rank sends per step (P_b = payload bytes of bucket b, as above):
//   all-reduce (ring all-gather of the payloads)   (N-1) sum_b P_b
//        against the uncompressed ring all-reduce   2 (N-1)/N a Psi
//   push (to the S servers but itself)             sum_{s != r} P_s     (+ the pull, a Psi_s (N-1) on a server)
//        against the uncompressed push              a Psi (minus the own slice)
// Per value of a bucket, the compressed all-gather beats the ring all-reduce when
//   topk 8 R (N-1) < 2a (N-1)/N: R < a/(4N)   randk R < a/(2N)   qsgd N < 16a/B   sign N < 16a
// The all-gather's traffic grows as (N-1) P while the ring's stays 2 (N-1)/N a Psi: the sparse
// methods lose their edge on many ranks (sparse supports differ per rank: no sum on the way).
//
// The sum. Ratio 1 (topk:1, randk:1) must give the uncompressed run bit for bit: the decoded
// values are added in exactly the order allreduce_ring (comm/ring.h) adds them, block b of the
// balanced split as ((d_{b+1} + d_{b+2}) + ...) + d_b, with comm_reduce_local and
// comm_avg_finish, and for the push in ps_push's order (comm/ps.h): ((d_s + d_{s-1}) + ...).
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
//
// Backends: the codec runs on the host, on fp32 copies (a staged wire: the device's floatX
// gradients are copied and widened to the host, the sum goes back narrowed). On CUDA the sum is
// fp32 (the uncompressed bf16 ring rounds after every addition), so only the CPU build's fp32
// run is compared bit for bit. Host buffers: residuals (4 sum_b n_b), two work arrays of the
// largest bucket, the wire and the sparse methods' index arrays, counted in "comm buffers".
#pragma once

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <vector>
#include "dp_mode.h"
#include "../comm/ps.h"
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
// The codec: host functions on fp32 arrays (unit-tested in test/test_compress.cu)

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

// ---------------------------------------------------------------------------------------
// The data-parallel side: a bucket per all-reduce call or server slice, its residual

typedef struct {
    floatX* grad;         // the bucket's gradients (device), as dp_allreduce_avg / the push see them
    size_t n;
    float* residual;      // host, n values (error feedback on; NULL off)
    uint64_t calls;       // how many times it was compressed: the step, for the seeds
} CmpBucket;

typedef struct DPCompress {
    CompressSpec spec;
    int error_feedback;
    int ps;                       // 1: the parameter server's push; 0: the all-reduce
    std::vector<CmpBucket> buckets;
    size_t nmax, pmax;            // largest bucket, its payload words
    float *a, *dec;               // host work: the values sent (a = g + e), then the sum; decoded values
    uint32_t* wire;               // all-reduce: N payloads; push: S payloads out, one in
    uint32_t *idx, *scratch;      // the sparse methods' indices (k) and selection scratch (n)
    size_t host_bytes;            // all of the above, counted as comm buffers
    // this step's checks (reset by compress_report_step)
    uint64_t values, conserved, guarded;
    double err2, norm2;           // sum (a - d)^2, sum a^2
    float max_err;
} DPCompress;

static inline uint64_t cmp_seed(uint64_t bucket, uint64_t step, uint64_t rank) {
    return 0x243F6A8885A308D3ull ^ (bucket * 0x9E3779B97F4A7C15ull) ^ (step * 0xBF58476D1CE4E5B9ull) ^ (rank * 0x94D049BB133111EBull);
}

// host bytes compress_create allocates (the formula: the same sizes, from the buckets)
static inline size_t cmp_host_bytes(const DPCompress* c, int N, int S) {
    size_t res = 0;
    for (const CmpBucket& b : c->buckets) { res += c->error_feedback ? b.n : 0; }
    size_t wire = (size_t)(c->ps ? S + 1 : N) * c->pmax;
    size_t sparse = cmp_sparse(&c->spec) ? cmp_k(&c->spec, c->nmax) + c->nmax : 0;
    return 4 * (res + 2 * c->nmax + wire + sparse);
}

static inline void* cmp_host_alloc(size_t bytes) {
    void* p = calloc(bytes ? bytes : 1, 1);
    if (!p) { die("--compress: out of host memory allocating %.1f MiB", bytes / 1048576.0); }
    return p;
}

// After the mode's init (its buckets exist): the buckets, residuals and wire buffers.
static inline void compress_create(DataParallel* dp, const char* spec, int error_feedback) {
    if (!spec || strcmp(spec, "none") == 0) { return; }
    DPCompress* c = new DPCompress();
    c->spec = compress_parse(spec);
    c->error_feedback = error_feedback;
    const char* mode = dp->ops->flag;
    c->ps = strcmp(mode, "ps") == 0;
    GPT2* m = dp->model;
    if (c->ps) {
        for (int s = 0; s < dp->ps_servers; s++) {
            c->buckets.push_back({m->grads_memory + comm_block_offset(dp->psi, dp->ps_servers, s),
                                  comm_block_count(dp->psi, dp->ps_servers, s), NULL, 0});
        }
    } else if (strcmp(mode, "naive") == 0) {
        c->buckets.push_back({m->grads_memory, dp->psi, NULL, 0});
    } else if (strcmp(mode, "ddp") == 0 && dp->ops->zero == 0) {
        for (const Bucket& b : dp->buckets) { c->buckets.push_back({b.grad, b.padded, NULL, 0}); }
    } else {
        die("--compress compresses the parameter server's push or the all-reduce (--dp-mode ps, naive or ddp): not --zero %d",
            dp->ops->zero);
    }
    c->nmax = c->pmax = 0;
    for (CmpBucket& b : c->buckets) {
        c->nmax = std::max(c->nmax, b.n);
        c->pmax = std::max(c->pmax, cmp_payload_words(&c->spec, b.n));
        if (error_feedback) {
            b.residual = (float*)cmp_host_alloc(b.n * sizeof(float));
            for (size_t i = 0; i < b.n; i++) { b.residual[i] = -0.0f; }
        }
    }
    c->a = (float*)cmp_host_alloc(c->nmax * sizeof(float));
    c->dec = (float*)cmp_host_alloc(c->nmax * sizeof(float));
    c->wire = (uint32_t*)cmp_host_alloc((size_t)(c->ps ? dp->ps_servers + 1 : dp->N) * c->pmax * sizeof(uint32_t));
    c->idx = cmp_sparse(&c->spec) ? (uint32_t*)cmp_host_alloc(cmp_k(&c->spec, c->nmax) * sizeof(uint32_t)) : NULL;
    c->scratch = cmp_sparse(&c->spec) ? (uint32_t*)cmp_host_alloc(c->nmax * sizeof(uint32_t)) : NULL;
    c->host_bytes = cmp_host_bytes(c, dp->N, dp->ps_servers);
    dp->mem_live[MEM_COMM] += c->host_bytes;
    dp->mem_peak[MEM_COMM] = std::max(dp->mem_peak[MEM_COMM], dp->mem_live[MEM_COMM]);
    dp->compress = c;
}

static inline void compress_free(DataParallel* dp) {
    DPCompress* c = dp->compress;
    if (!c) { return; }
    for (CmpBucket& b : c->buckets) { free(b.residual); }
    free(c->a);
    free(c->dec);
    free(c->wire);
    free(c->idx);
    free(c->scratch);
    dp->mem_live[MEM_COMM] -= c->host_bytes;
    delete c;
    dp->compress = NULL;
}

static inline CmpBucket* cmp_find(DPCompress* c, const floatX* grad, size_t n) {
    for (CmpBucket& b : c->buckets) {
        if (b.grad == grad && b.n == n) { return &b; }
    }
    die("--compress: no compression bucket for a buffer of %zu values (internal error)", n);
    return NULL;
}

// a = g + e of bucket b into c->a; compress it into out; the residual and the checks.
// Leaves D(C(a)) in c->dec.
static inline void cmp_compress_bucket(DataParallel* dp, DPCompress* c, CmpBucket* b, int id, uint32_t* out) {
    size_t n = b->n;
    copy_floats_to_host(c->a, b->grad, n);   // the staged wire: device floatX -> host fp32
    if (b->residual) {
        for (size_t i = 0; i < n; i++) { c->a[i] += b->residual[i]; }
    }
    uint64_t step = b->calls++;
    // randk: the same indices on every rank (rank 0 in the seed); qsgd: each rank its own draws
    uint64_t seed = cmp_seed(id, step, c->spec.method == CMP_RANDK ? 0 : 1 + dp->rank);
    c->guarded += cmp_encode(&c->spec, c->a, n, seed, c->error_feedback, out, c->idx, c->scratch);
    cmp_decode(&c->spec, out, n, c->idx, 0, n, c->dec);
    for (size_t i = 0; i < n; i++) {
        double diff = (double)c->a[i] - (double)c->dec[i];
        c->err2 += diff * diff;
        c->norm2 += (double)c->a[i] * c->a[i];
    }
    if (b->residual) {
        c->values += n;
        c->conserved += cmp_residual(&c->spec, c->a, c->dec, c->idx, b->residual, n, &c->max_err);
    }
}

// The all-reduce of a bucket (dp_allreduce_avg): compress, all-gather the payloads over our
// counted ring (or the native all-gather), decode and add in the ring's order, average.
static inline void compress_allreduce(DataParallel* dp, floatX* buf, size_t n) {
    DPCompress* c = dp->compress;
    CmpBucket* b = cmp_find(c, buf, n);
    int N = dp->N, r = dp->rank, id = (int)(b - c->buckets.data());
    size_t P = cmp_payload_words(&c->spec, n);
    cmp_compress_bucket(dp, c, b, id, c->wire + (size_t)r * P);
    if (dp->use_ring) { allgather_ring(dp->comm, c->wire + (size_t)r * P, c->wire, (size_t)N * P, COMM_INT32); }
    else { allgather_native(dp->comm, c->wire + (size_t)r * P, c->wire, (size_t)N * P, COMM_INT32); }
    // block j of the balanced split is summed as the ring sums it: d_{j+1} first, d_j last
    float* sum = c->a;
    for (int t = 1; t <= N; t++) {
        for (int blk = 0; blk < N; blk++) {
            int src = (blk + t) % N;
            size_t lo = comm_block_offset(n, N, blk), cnt = comm_block_count(n, N, blk);
            if (cnt == 0) { continue; }
            float* into = t == 1 ? sum + lo : c->dec;
            cmp_decode(&c->spec, c->wire + (size_t)src * P, n, c->idx, lo, lo + cnt, into);
            if (t > 1) { comm_reduce_local(sum + lo, c->dec, cnt, COMM_FP32, COMM_SUM); }
        }
    }
    comm_avg_finish(sum, n, COMM_FP32, COMM_AVG, N);
    copy_floats_to_device(buf, sum, n);
}

// The push (ps_update): every rank compresses every slice, sends slice s to server s in
// ps_push's rounds; a server decodes and adds in ps_push's order (its own first, then the
// ranks r-1, r-2, ...), averages, and leaves the result in its slice of the gradients.
static inline void compress_ps_push(DataParallel* dp) {
    DPCompress* c = dp->compress;
    Comm* cm = dp->comm;
    int p = dp->N, r = dp->rank, S = dp->ps_servers;
    uint32_t* in = c->wire + (size_t)S * c->pmax;
    float* acc = NULL;
    std::vector<int> order;   // a server's own slice last: c->dec and c->idx (randk) are then its
    for (int s = 0; s < S; s++) {
        if (s != r) { order.push_back(s); }
    }
    if (r < S) { order.push_back(r); }
    for (int s : order) { cmp_compress_bucket(dp, c, &c->buckets[s], s, c->wire + (size_t)s * c->pmax); }
    size_t mine = r < S ? c->buckets[r].n : 0;
    if (r < S) {   // the sum starts with the server's own decoded slice
        acc = c->a;
        memcpy(acc, c->dec, mine * sizeof(float));
    }
    for (int k = 1; k < p; k++) {
        int dst = (r + k) % p, src = (r - k + p) % p;
        bool out = dst < S, inc = r < S;
        const uint32_t* o = out ? c->wire + (size_t)dst * c->pmax : NULL;
        size_t no = out ? cmp_payload_words(&c->spec, c->buckets[dst].n) : 0;
        size_t ni = inc ? cmp_payload_words(&c->spec, mine) : 0;
        if (out && inc) { comm_sendrecv(cm, o, no, dst, in, ni, src, COMM_INT32); }
        else if (out) { comm_send(cm, o, no, COMM_INT32, dst); }
        else if (inc) { comm_recv(cm, in, ni, COMM_INT32, src); }
        if (inc) {
            cmp_decode(&c->spec, in, mine, c->idx, 0, mine, c->dec);
            comm_reduce_local(acc, c->dec, mine, COMM_FP32, COMM_SUM);
        }
    }
    if (r < S) {
        comm_avg_finish(acc, mine, COMM_FP32, COMM_AVG, p);
        copy_floats_to_device(c->buckets[r].grad, acc, mine);
    }
}

// ---------------------------------------------------------------------------------------
// What the lecture predicts, and what the run shows

// bytes this rank sends per step (the pull of parameters, uncompressed, included)
static inline uint64_t compress_formula_bytes(const DataParallel* dp) {
    const DPCompress* c = dp->compress;
    uint64_t bytes = 0;
    if (c->ps) {
        int r = dp->rank, S = dp->ps_servers;
        for (int s = 0; s < S; s++) {
            if (s != r) { bytes += 4 * cmp_payload_words(&c->spec, c->buckets[s].n); }
        }
        if (r < S) { bytes += (uint64_t)(dp->N - 1) * c->buckets[r].n * sizeof(floatX); }
        return bytes;
    }
    for (const CmpBucket& b : c->buckets) { bytes += (uint64_t)(dp->N - 1) * 4 * cmp_payload_words(&c->spec, b.n); }
    return bytes;
}
// what the same buckets cost uncompressed (the ring all-reduce, or push + pull)
static inline uint64_t compress_plain_bytes(const DataParallel* dp) {
    const DPCompress* c = dp->compress;
    if (c->ps) { return allreduce_parameter_server_volume(dp->psi, COMM_FLOATX, dp->N, dp->rank, dp->ps_servers).bytes; }
    uint64_t bytes = 0;
    for (const CmpBucket& b : c->buckets) { bytes += allreduce_ring_volume(b.n, COMM_FLOATX, dp->N, dp->rank).bytes; }
    return bytes;
}

static inline void compress_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    if (dp->compress) { out[MEM_COMM] += cmp_host_bytes(dp->compress, dp->N, dp->ps_servers); }
}

static inline void compress_print_plan(const DataParallel* dp) {
    const DPCompress* c = dp->compress;
    if (!c) { return; }
    const CompressSpec* s = &c->spec;
    char what[96];
    if (cmp_sparse(s)) {
        snprintf(what, sizeof(what), "%s:%g, k = ceil(R n) values%s", CMP_NAMES[s->method], s->ratio,
                 s->method == CMP_TOPK ? " + int32 indices" : " (indices from a shared seed)");
    } else if (s->method == CMP_QSGD) {
        snprintf(what, sizeof(what), "qsgd:%d, %d levels of a power-of-two step per bucket", s->bits, cmp_levels(s->bits));
    } else {
        snprintf(what, sizeof(what), "sign, 1 bit per value + scale mean|a| per bucket");
    }
    printf("compress     %s | error feedback %s | %zu bucket(s) (%s) | host buffers %.3f MiB, in comm buffers\n", what,
           c->error_feedback ? "on" : "off", c->buckets.size(), c->ps ? "server slices: push" : "all-gather of payloads",
           c->host_bytes / 1048576.0);
    printf("compress     this rank sends %llu B per step (formula), uncompressed %llu B: %.4fx\n",
           (unsigned long long)compress_formula_bytes(dp), (unsigned long long)compress_plain_bytes(dp),
           (double)compress_formula_bytes(dp) / std::max((uint64_t)1, compress_plain_bytes(dp)));
}

// Under the step's comm line: every rank's bytes against the formula, the conservation check
// summed over the ranks, the relative compression error.
static inline void compress_report_step(DataParallel* dp, uint64_t sent, uint64_t want) {
    DPCompress* c = dp->compress;
    if (!c) { return; }
    double v[6] = {(double)c->values, (double)c->conserved, (double)c->guarded, c->err2, c->norm2,
                   (double)(sent == want)};
    double mx = c->max_err;
    MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_DOUBLE, MPI_SUM, dp->comm->mpi);   // small, not counted
    MPI_Allreduce(MPI_IN_PLACE, &v[5], 1, MPI_DOUBLE, MPI_MIN, dp->comm->mpi);
    MPI_Allreduce(MPI_IN_PLACE, &mx, 1, MPI_DOUBLE, MPI_MAX, dp->comm->mpi);
    printf(" compress | %s", dp->use_ring || c->ps ? (v[5] == 1.0 ? "bytes = formula on all ranks" : "bytes DIFFERENT from the formula on some rank")
                                                    : "native all-gather: bytes not counted");
    printf(" | relative error ||a - d|| / ||a|| = %.4f", v[4] > 0 ? sqrt(v[3] / v[4]) : 0.0);
    unsigned long long n = (unsigned long long)v[0], ok = (unsigned long long)v[1];
    if (!c->error_feedback) {
        printf(" | error feedback off\n");
    } else if (!cmp_exact(&c->spec)) {
        if (ok == n) {
            printf(" | error feedback: residual = fl(accumulated - sent), |accumulated - (sent + residual)| <= ulp(residual)/2 "
                   "on all %llu values (largest %.3e)\n", n, mx);
        } else {
            printf(" | error feedback: CONSERVATION FAILED on %llu of %llu values\n", n - ok, n);
        }
    } else if (ok == n) {
        printf(" | error feedback: sent + residual = accumulated exactly on all %llu values", n);
        if (c->spec.method == CMP_QSGD) { printf(" (%.0f rounded down by the guard)", v[2]); }
        printf("\n");
    } else {
        printf(" | error feedback: CONSERVATION FAILED on %llu of %llu values\n", n - ok, n);
    }
    c->values = c->conserved = c->guarded = 0;
    c->err2 = c->norm2 = 0.0;
    c->max_err = 0.0f;
}
