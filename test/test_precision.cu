// Exact tests of the number formats (llmc/precision.h) and of the CPU backend's reduced-precision
// storage (llmc/cpu/memory.h: floatx_round; llmc/cpu/adamw.h: master weights).
//
// 1. The rounding helpers against a reference built here from the formats' definitions. Every
//    code of each format is decoded by a plain decoder (sign, biased exponent, mantissa; the
//    exponent field 0 holds the subnormals; IEEE-like formats spend the all-ones exponent on
//    inf and NaN, E4M3 "fn" only the code S.1111.111 on NaN and has no inf). From that table:
//      - every finite value rounds to itself (-0 keeps its sign);
//      - for every pair of adjacent values, their midpoint (exact in double, and asserted to be
//        a float) rounds to the one with the even code (ties to even), and the floats either
//        side of the midpoint (nextafterf) round to the nearer one; both signs;
//      - underflow: below half the smallest subnormal -> signed zero, the exact half -> zero;
//      - overflow: bf16, fp16, E5M2 (IEEE): max + half an ulp -> inf (the tie goes to the even
//        neighbour, which is the next binade: inf), just below -> max, inf -> inf; E4M3 and
//        round_e5m2_sat saturate: anything above max, inf included -> max;
//      - NaN stays NaN (several payloads, both signs);
//      - a few million random floats over every exponent against a nearest-even rounding that
//        searches the table, bit for bit; round_bf16 also against a second bit-level rounding
//        (truncate, compare the two candidates in double), and round_fp16 against the compiler's
//        (float)(_Float16)x where _Float16 exists.
// 2. Stochastic rounding (round_bf16_stochastic): the result is one of the two bf16 neighbours;
//    over all 2^16 random words the average is exactly x (so the rounding is unbiased); over the
//    bits the AdamW uses (stochastic_bits) the mean is x within 5 binomial sigmas; bf16 values
//    are fixed points for any random word; inf and NaN are kept.
// 3. The CPU kernels with cpu_prec.prec = bf16 and fp16: every floatX output is exactly
//    representable and equals the fp32 kernel's output (same inputs) rounded once; the fp32
//    state (layernorm mean/rstd, attention probabilities, losses) is untouched; the flushed and
//    overflowed counters count what they say. AdamW with a master: the master is the fp32
//    update and params[i] == round_bf16_stochastic(master[i], stochastic_bits(i, seed)) (bf16),
//    round_fp16(master[i]) (fp16).
// test/test_precision.sh runs this and then builds copies with deliberate bugs in
// llmc/precision.h and llmc/cpu/ to see each reported as FAIL.
// Prints PASS/FAIL lines; exits 1 if any failed.
#include <float.h>
#include <stdarg.h>
#include <vector>
#include <string>
#include <algorithm>
#include "../llmc/common.h"
#include "../llmc/backend.h"
#include "../llmc/rand.h"

static int failures = 0;
#ifdef __FLT16_MAX__
#define HAVE_FLOAT16 1   // GCC 12+ and Clang on x86-64: the compiler's IEEE binary16
#else
#define HAVE_FLOAT16 0
#endif

static void report(const std::string& name, int ok, const std::string& detail = "") {
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
    if (!ok) { failures++; }
}

static std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
static std::string fmt(const char* f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof(buf), f, ap);
    va_end(ap);
    return buf;
}

// the bits of a float, for messages
static std::string show(float x) { return fmt("%.9g (0x%08x)", x, f32_bits(x)); }

// same value and same sign of zero; NaN equals NaN
static int same(float a, float b) {
    if (a != a || b != b) { return a != a && b != b; }
    return f32_bits(a) == f32_bits(b);
}

// Up to a few mismatches are shown under a FAIL line.
struct Misses {
    size_t n = 0;
    std::vector<std::string> first;
    void add(const std::string& s) {
        if (n++ < 4) { first.push_back(s); }
    }
    std::string text() const {
        std::string s = fmt("%zu mismatches", n);
        for (const std::string& f : first) { s += "\n       " + f; }
        return s;
    }
};

// ---------------------------------------------------------------------------------------------
// 1. the formats, from their definitions

typedef float (*RoundFn)(float);

struct Format {
    const char* name;
    int ebits, mbits, bias;
    int fn;          // E4M3 "fn": no inf; only the all-ones code (both signs) is NaN
    int saturate;    // the rounding under test maps overflow to +-max instead of +-inf
    RoundFn round;
    double max_expected, min_sub_expected, min_normal_expected;
};

enum { DEC_FINITE, DEC_INF, DEC_NAN };

// The value of code c, written from the format definition: (-1)^s 2^(e - bias) (1 + m / 2^M) for
// a normal exponent field e, (-1)^s 2^(1 - bias) (m / 2^M) for e = 0.
static double decode(const Format& f, uint32_t c, int* kind) {
    int nbits = 1 + f.ebits + f.mbits;
    uint32_t s = (c >> (nbits - 1)) & 1u;
    uint32_t e = (c >> f.mbits) & ((1u << f.ebits) - 1u);
    uint32_t m = c & ((1u << f.mbits) - 1u);
    uint32_t e_all = (1u << f.ebits) - 1u, m_all = (1u << f.mbits) - 1u;
    *kind = DEC_FINITE;
    if (f.fn) {
        if (e == e_all && m == m_all) { *kind = DEC_NAN; return NAN; }
    } else if (e == e_all) {
        *kind = m == 0 ? DEC_INF : DEC_NAN;
        return m == 0 ? (s ? -INFINITY : INFINITY) : NAN;
    }
    double v = e == 0 ? ldexp((double)m, 1 - f.bias - f.mbits) : ldexp((double)((1u << f.mbits) + m), (int)e - f.bias - f.mbits);
    return s ? -v : v;
}

// The non-negative finite values of a format in code order (code i = vals[i]), read off the
// decoder; the codes of a sign-magnitude format are ordered like their values (checked).
struct Table {
    std::vector<double> vals;
    double max() const { return vals.back(); }
    double top_ulp() const { return vals.back() - vals[vals.size() - 2]; }
};

// Nearest-even rounding by searching the table: the reference the helpers are compared with.
static float table_round(const Format& f, const Table& t, float x) {
    if (x != x) { return x; }
    double a = fabs((double)x), M = t.max(), r;
    if (a > M) {
        // IEEE: the next value above max would be max + ulp (the next binade, which the format
        // spends on inf), so anything at or past the midpoint max + ulp/2 rounds to inf (at the
        // midpoint, ties to even: max's code is odd, the next even); saturating: max
        if (f.saturate) {
            r = M;
        } else {
            r = a >= M + t.top_ulp() / 2 ? INFINITY : M;
        }
    } else {
        size_t i = std::upper_bound(t.vals.begin(), t.vals.end(), a) - t.vals.begin() - 1;   // vals[i] <= a
        if (t.vals[i] == a) {
            r = a;
        } else {
            double lo = t.vals[i], hi = t.vals[i + 1], dlo = a - lo, dhi = hi - a;   // exact in double
            r = dlo < dhi ? lo : dhi < dlo ? hi : (i % 2 == 0 ? lo : hi);
        }
    }
    return copysignf((float)r, x);
}

// a float from random bits whose exponent lies in [lo, hi] (unbiased fp32 exponents; -127 gives
// an fp32 subnormal), random mantissa and sign
static float random_float_exp(Rng* rng, int lo, int hi) {
    int e = lo + (int)(rng_u32(rng) % (uint32_t)(hi - lo + 1));
    uint32_t sign = rng_u32(rng) & 0x80000000u;
    uint32_t mant = rng_u32(rng) & 0x7fffffu;
    // a few exact ties and near-ties: mantissas with long runs of zeros or ones below a bit
    uint32_t kind = rng_u32(rng) % 4;
    if (kind == 1) { mant &= ~((1u << (rng_u32(rng) % 24)) - 1u); }
    if (kind == 2) { mant |= (1u << (rng_u32(rng) % 24)) - 1u; }
    return bits_f32(sign | ((uint32_t)(e + 127) << 23) | mant);
}

// round_bf16, a second way: truncate to the bf16 below (toward zero), take the next bf16 up
// (the exponent carries; past the largest finite that is inf), and pick the nearer in double
static float bf16_by_candidates(float x) {
    if (x != x) { return x; }
    if (isinf(x)) { return x; }
    uint32_t u = f32_bits(x);
    float lo = bits_f32(u & 0xffff0000u), hi = bits_f32((u & 0xffff0000u) + 0x10000u);
    if (lo == x) { return x; }
    double dlo = fabs((double)x - lo), dhi = isinf(hi) ? fabs((double)x - copysign(ldexp(1.0, 128), x)) : fabs((double)hi - x);
    if (dlo < dhi) { return lo; }
    if (dhi < dlo) { return hi; }
    return (f32_bits(lo) & 0x10000u) ? hi : lo;   // tie: the even bf16 code
}

static void test_format(const Format& f) {
    const char* n = f.name;
    int nbits = 1 + f.ebits + f.mbits;
    uint32_t ncodes = 1u << nbits, sign_bit = 1u << (nbits - 1);
    printf("\n[%s] %d bits: 1 sign, %d exponent (bias %d), %d mantissa%s\n", n, nbits, f.ebits, f.bias, f.mbits,
           f.fn ? "; fn: no inf, S.1111.111 is NaN" : "");

    // --- the decoder and the table
    Table t;
    size_t finite = 0, infs = 0, nans = 0;
    int ordered = 1, bf16_bits_ok = 1, f16_ok = 1;
    for (uint32_t c = 0; c < ncodes; c++) {
        int kind;
        double v = decode(f, c, &kind);
        finite += kind == DEC_FINITE;
        infs += kind == DEC_INF;
        nans += kind == DEC_NAN;
        if (c < sign_bit && kind == DEC_FINITE) {
            if (!t.vals.empty() && !(v > t.vals.back())) { ordered = 0; }
            if (c != t.vals.size()) { ordered = 0; }   // the finite positive codes are 0..N-1
            t.vals.push_back(v);
        }
        if (strcmp(n, "bf16") == 0) {   // bf16 is fp32's upper 16 bits
            float w = bits_f32(c << 16);
            if (kind == DEC_NAN ? w == w : !same((float)v, w)) { bf16_bits_ok = 0; }
        }
#ifdef __FLT16_MAX__
        if (strcmp(n, "fp16") == 0) {   // the compiler's own binary16
            uint16_t h = (uint16_t)c;
            _Float16 hv;
            memcpy(&hv, &h, 2);
            float w = (float)hv;
            if (kind == DEC_NAN ? w == w : !same((float)v, w)) { f16_ok = 0; }
        }
#endif
    }
    double min_sub = t.vals[1], min_normal = t.vals[(size_t)1 << f.mbits];
    size_t expect_finite = f.fn ? ncodes - 2 : ncodes - 2 * ((size_t)1 << f.mbits);
    int dec_ok = ordered && finite == expect_finite && infs == (f.fn ? 0u : 2u) && nans == ncodes - finite - infs &&
                 t.max() == f.max_expected && min_sub == f.min_sub_expected && min_normal == f.min_normal_expected &&
                 bf16_bits_ok && f16_ok;
    report(fmt("%s decoder: %zu finite codes, %zu inf, %zu NaN; largest %.9g, smallest normal %.3g, smallest subnormal "
               "%.3g; values increase with the code%s", n, finite, infs, nans, t.max(), min_normal, min_sub,
               strcmp(n, "bf16") == 0 ? "; each is fp32's value of the code << 16" :
               strcmp(n, "fp16") == 0 && HAVE_FLOAT16 ? "; each is the compiler's _Float16 value of the code" : ""),
           dec_ok);
    // every value of the format is a float (so the helpers can return it)
    int all_floats = 1;
    for (double v : t.vals) { all_floats &= (double)(float)v == v; }
    if (!all_floats) { report(fmt("%s: every value is exactly a float", n), 0); return; }

    // --- fixed points: every finite value, both signs, rounds to itself (-0 keeps its sign)
    {
        Misses m;
        for (double v : t.vals) {
            for (int s = 0; s < 2; s++) {
                float x = s ? -(float)v : (float)v, r = f.round(x);
                if (!same(r, x)) { m.add(fmt("%s -> %s", show(x).c_str(), show(r).c_str())); }
            }
        }
        report(fmt("%s: every finite value (%zu, both signs, -0 included) rounds to itself", n, 2 * t.vals.size()),
               m.n == 0, m.n ? m.text() : "");
    }

    // --- ties to even at every midpoint, and the midpoint's float neighbours to the nearer value
    {
        Misses ties, sides;
        int exact = 1;
        size_t count = 0;
        for (size_t i = 0; i + 1 < t.vals.size(); i++) {
            double lo = t.vals[i], hi = t.vals[i + 1], mid = (lo + hi) / 2;   // exact in double
            if ((double)(float)mid != mid) { exact = 0; continue; }
            float even = (float)(i % 2 == 0 ? lo : hi);
            float below = nextafterf((float)mid, 0.0f), above = nextafterf((float)mid, INFINITY);
            for (int s = 0; s < 2; s++) {
                float sg = s ? -1.0f : 1.0f;
                float r = f.round(sg * (float)mid);
                if (!same(r, sg * even)) {
                    ties.add(fmt("midpoint %s of %.9g and %.9g -> %s, expected %.9g", show(sg * (float)mid).c_str(), lo, hi,
                                 show(r).c_str(), sg * even));
                }
                float rb = f.round(sg * below), ra = f.round(sg * above);
                if (!same(rb, sg * (float)lo)) {
                    sides.add(fmt("%s (below the midpoint of %.9g and %.9g) -> %s", show(sg * below).c_str(), lo, hi,
                                  show(rb).c_str()));
                }
                if (!same(ra, sg * (float)hi)) {
                    sides.add(fmt("%s (above the midpoint of %.9g and %.9g) -> %s", show(sg * above).c_str(), lo, hi,
                                  show(ra).c_str()));
                }
            }
            count++;
        }
        report(fmt("%s: all %zu midpoints of adjacent values are floats", n, t.vals.size() - 1), exact);
        report(fmt("%s: ties to even: each of the %zu midpoints (both signs) rounds to the even code", n, count),
               ties.n == 0, ties.n ? ties.text() : "");
        report(fmt("%s: the floats just below and above each midpoint round to the nearer value", n), sides.n == 0,
               sides.n ? sides.text() : "");
    }

    // --- underflow: zero and the smallest subnormal s
    {
        float s = (float)min_sub, h = s / 2;   // h is exact: asserted with the midpoints
        struct { float x, expect; } cases[] = {
            {0.0f, 0.0f}, {-0.0f, -0.0f}, {h, 0.0f}, {-h, -0.0f}, {nextafterf(h, 0.0f), 0.0f}, {-nextafterf(h, 0.0f), -0.0f},
            {h / 2, 0.0f}, {-h / 2, -0.0f}, {bits_f32(1u), 0.0f}, {bits_f32(0x80000001u), -0.0f},
            {nextafterf(h, 1.0f), s}, {-nextafterf(h, 1.0f), -s}, {s, s}, {1.5f * s, 2 * s}, {-2.5f * s, -2 * s},
        };
        Misses m;
        for (auto& c : cases) {
            float r = f.round(c.x);
            if (!same(r, c.expect)) { m.add(fmt("%s -> %s, expected %s", show(c.x).c_str(), show(r).c_str(), show(c.expect).c_str())); }
        }
        report(fmt("%s: underflow: below half the smallest subnormal (%.3g) -> signed 0, the exact half -> 0 (even), "
                   "just above -> the smallest subnormal", n, min_sub), m.n == 0, m.n ? m.text() : "");
    }

    // --- overflow
    {
        float M = (float)t.max(), half = (float)(t.top_ulp() / 2), edge = M + half;   // M + ulp/2 is a float
        float past = f.saturate ? M : INFINITY;
        int edge_exact = (double)edge == t.max() + t.top_ulp() / 2;
        struct { float x, expect; } cases[] = {
            {nextafterf(edge, 0.0f), M}, {edge, past}, {nextafterf(edge, INFINITY), past}, {2 * M, past},
            {FLT_MAX, past}, {INFINITY, past}, {M, M}, {nextafterf(M, INFINITY), M},
        };
        Misses m;
        for (auto& c : cases) {
            for (int s = 0; s < 2; s++) {
                float x = s ? -c.x : c.x, e = s ? -c.expect : c.expect, r = f.round(x);
                if (!same(r, e)) { m.add(fmt("%s -> %s, expected %s", show(x).c_str(), show(r).c_str(), show(e).c_str())); }
            }
        }
        report(fmt(f.saturate ? "%s: overflow saturates: above max %.9g (max + half ulp %.9g, FLT_MAX, inf) -> +-max"
                              : "%s: overflow: max + half ulp (%.9g + %.9g) and above -> +-inf (the tie goes to the next "
                                "binade), just below -> +-max, inf -> inf",
                   n, t.max(), f.saturate ? (double)edge : (double)half),
               m.n == 0 && edge_exact, m.n ? m.text() : "");
    }

    // --- NaN
    {
        uint32_t payloads[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu, 0x7fbfffffu, 0x7fc0ffffu};
        Misses m;
        for (uint32_t p : payloads) {
            float r = f.round(bits_f32(p));
            if (r == r) { m.add(fmt("NaN 0x%08x -> %s", p, show(r).c_str())); }
        }
        report(fmt("%s: NaN stays NaN (8 payloads, both signs, quiet and signalling)", n), m.n == 0, m.n ? m.text() : "");
    }

    // --- random floats against the table's rounding (and the second implementations)
    {
        Rng rng;
        rng_init(&rng, 1234 + (uint64_t)nbits * 7 + (uint64_t)f.saturate);
        const size_t N = strcmp(n, "bf16") == 0 || strcmp(n, "fp16") == 0 ? 3000000 : 1000000;
        Misses m, m2;
        // exponents: every fp32 exponent for bf16 and raw random bits; for the narrow formats the
        // range around theirs (below the smallest subnormal to past the largest), and every fp32
        // exponent for a third of them
        int elo = (int)log2(min_sub) - 3, ehi = (int)log2(t.max()) + 3;
        for (size_t k = 0; k < N; k++) {
            float x;
            uint32_t which = k % 3;
            if (which == 0) {
                x = bits_f32(rng_u32(&rng));
            } else if (which == 1 || strcmp(n, "bf16") == 0) {
                x = random_float_exp(&rng, -127, 127);
            } else {
                x = random_float_exp(&rng, std::max(elo, -127), std::min(ehi, 127));
            }
            float r = f.round(x), e = table_round(f, t, x);
            if (!same(r, e)) { m.add(fmt("%s -> %s, table says %s", show(x).c_str(), show(r).c_str(), show(e).c_str())); }
            if (strcmp(n, "bf16") == 0) {
                float e2 = bf16_by_candidates(x);
                if (!same(r, e2)) { m2.add(fmt("%s -> %s, the candidates say %s", show(x).c_str(), show(r).c_str(), show(e2).c_str())); }
            }
#ifdef __FLT16_MAX__
            if (strcmp(n, "fp16") == 0) {
                float e2 = (float)(_Float16)x;
                if (!same(r, e2)) { m2.add(fmt("%s -> %s, (float)(_Float16)x is %s", show(x).c_str(), show(r).c_str(), show(e2).c_str())); }
            }
#endif
        }
        report(fmt("%s: %zu random floats (every exponent, ties and near-ties) = the table's nearest-even rounding, "
                   "bit for bit", n, N), m.n == 0, m.n ? m.text() : "");
        if (strcmp(n, "bf16") == 0) {
            report(fmt("bf16: the same %zu floats = a second rounding (truncate, then the nearer of the two candidates)", N),
                   m2.n == 0, m2.n ? m2.text() : "");
        }
        if (strcmp(n, "fp16") == 0) {
#ifdef __FLT16_MAX__
            report(fmt("fp16: the same %zu floats = the compiler's (float)(_Float16)x", N), m2.n == 0, m2.n ? m2.text() : "");
#else
            printf("SKIP fp16 against _Float16: the compiler has no _Float16\n");
#endif
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. stochastic rounding to bf16

static void test_stochastic() {
    printf("\n[bf16 stochastic rounding]\n");
    Rng rng;
    rng_init(&rng, 99);
    // (a) every one of the 2^16 random words, for 3000 random x (every exponent): each result is
    //     the bf16 below (toward zero) or above x, and their sum is exactly 65536 x: the chance
    //     of rounding away from zero is exactly (|x| - |lo|) / ulp, so the rounding is unbiased
    {
        Misses m, mean;
        const int NX = 3000;
        for (int k = 0; k < NX; k++) {
            // the first 100 fp32 subnormals (bf16 has the same subnormals, quantum 2^-133)
            float x = k < 100 ? random_float_exp(&rng, -127, -127) : random_float_exp(&rng, -126, 126);
            uint32_t u = f32_bits(x);
            float lo = bits_f32(u & 0xffff0000u), hi = bits_f32((u & 0xffff0000u) + 0x10000u);
            double sum = 0.0;   // at most 2^16 terms of <= 2^17 significant bits: exact
            for (uint32_t r = 0; r < 65536; r++) {
                float y = round_bf16_stochastic(x, r | (rng_u32(&rng) & 0xffff0000u));   // the high bits must not matter
                if (!(same(y, lo) || (same(y, hi) && lo != x))) {
                    m.add(fmt("x %s, r 0x%04x -> %s (neighbours %.9g, %.9g)", show(x).c_str(), r, show(y).c_str(), lo, hi));
                }
                sum += y;
            }
            if (sum != 65536.0 * (double)x) {
                mean.add(fmt("x %s: the average over all 2^16 words is %.17g", show(x).c_str(), sum / 65536.0));
            }
        }
        report(fmt("stochastic: %d random x (bf16 subnormals to 2^126) x all 2^16 random words: always one of the two "
                   "bf16 neighbours", NX), m.n == 0, m.n ? m.text() : "");
        report("stochastic: the average over all 2^16 random words is exactly x (unbiased)", mean.n == 0,
               mean.n ? mean.text() : "");
    }
    // (b) the bits AdamW uses: stochastic_bits(i, seed) for i < 2^20, the mean within 5 sigma of
    //     the binomial for several rounding-up probabilities p
    {
        Misses m;
        const size_t N = (size_t)1 << 20;
        double worst = 0.0;
        float xs[] = {1.0f + 0x8000 * ldexpf(1.0f, -23), 1.0f + 0x4000 * ldexpf(1.0f, -23), -3.0f - 0x0100 * ldexpf(1.0f, -22),
                      1e-3f, 0.1f, -7.77e5f, 2.0f + 0xff00 * ldexpf(1.0f, -22), 1e-38f};
        uint32_t seeds[] = {0u, 1u, 1234567u, 0xdeadbeefu};
        for (float x : xs) {
            for (uint32_t seed : seeds) {
                uint32_t u = f32_bits(x);
                double lo = bits_f32(u & 0xffff0000u), hi = bits_f32((u & 0xffff0000u) + 0x10000u);
                double p = ((double)x - lo) / (hi - lo);
                double sum = 0.0;
                for (size_t i = 0; i < N; i++) { sum += round_bf16_stochastic(x, stochastic_bits(i, seed)); }
                double mean = sum / N, sigma = fabs(hi - lo) * sqrt(p * (1 - p) / N);
                double z = sigma > 0 ? fabs(mean - x) / sigma : (mean == x ? 0.0 : INFINITY);
                worst = fmax(worst, z);
                if (!(z <= 5.0)) { m.add(fmt("x %s seed %u: mean %.9g, %.1f sigma away (p %.4f)", show(x).c_str(), seed, mean, z, p)); }
            }
        }
        report(fmt("stochastic: with stochastic_bits(i, seed), i < 2^20, 8 values x 4 seeds: the mean is x within 5 "
                   "sigma (worst %.2f sigma)", worst), m.n == 0, m.n ? m.text() : "");
        // different seeds give different bits; an index above 2^32 is not folded onto a lower one
        int differ = stochastic_bits(5, 1) != stochastic_bits(5, 2) && stochastic_bits(5, 1) != stochastic_bits(6, 1) &&
                     stochastic_bits((size_t)5 + ((size_t)1 << 32), 1) != stochastic_bits(5, 1);
        report("stochastic: stochastic_bits depends on the seed and on the whole index", differ);
    }
    // (c) bf16 values are fixed points for any random word; inf and NaN kept
    {
        Misses m;
        uint32_t words[] = {0u, 1u, 0x7fffu, 0x8000u, 0xffffu, 0x12345678u, 0xffffffffu};
        for (uint32_t c = 0; c < 65536; c++) {
            float x = bits_f32(c << 16);
            if (x != x) { continue; }
            for (uint32_t r : words) {
                float y = round_bf16_stochastic(x, r);
                if (!same(y, x)) { m.add(fmt("%s, r 0x%08x -> %s", show(x).c_str(), r, show(y).c_str())); }
            }
        }
        report("stochastic: every bf16 value (inf, -0 included) is a fixed point for any random word", m.n == 0, m.n ? m.text() : "");
        Misses mn;
        uint32_t payloads[] = {0x7fc00000u, 0xffc00000u, 0x7fffffffu, 0x7f800001u, 0xff80ffffu, 0x7fbf0001u};
        for (uint32_t p : payloads) {
            for (uint32_t r : words) {
                float y = round_bf16_stochastic(bits_f32(p), r);
                if (y == y) { mn.add(fmt("NaN 0x%08x, r 0x%08x -> %s", p, r, show(y).c_str())); }
            }
        }
        report("stochastic: NaN stays NaN (6 payloads, quiet and signalling, any random word)", mn.n == 0, mn.n ? mn.text() : "");
    }
}

// ---------------------------------------------------------------------------------------------
// 3. the CPU kernels' rounding, and AdamW with master weights

static Rng krng;

static std::vector<float> randv(size_t n, float std, int prec) {
    std::vector<float> v(n);
    rng_normal(&krng, v.data(), n, 0.0f, std);
    for (float& x : v) { x = round_to(prec, x); }   // inputs as the model stores them
    return v;
}

// one output of a kernel run in precision prec against the same kernel in fp32
static void check_output(const char* kernel, const char* out, int prec, const std::vector<float>& ours,
                         const std::vector<float>& fp32, Misses* rep, Misses* once) {
    for (size_t i = 0; i < ours.size(); i++) {
        if (!same(round_to(prec, ours[i]), ours[i])) {
            rep->add(fmt("%s %s[%zu] = %s is not a %s value", kernel, out, i, show(ours[i]).c_str(), precision_name(prec)));
        }
        if (!same(ours[i], round_to(prec, fp32[i]))) {
            once->add(fmt("%s %s[%zu] = %s, the fp32 kernel's %s rounded is %s", kernel, out, i, show(ours[i]).c_str(),
                          show(fp32[i]).c_str(), show(round_to(prec, fp32[i])).c_str()));
        }
    }
}

// an fp32 state output (not floatX): bit-identical to the fp32 kernel's
static void check_state(const char* kernel, const char* out, const std::vector<float>& ours, const std::vector<float>& fp32,
                        Misses* m) {
    for (size_t i = 0; i < ours.size(); i++) {
        if (!same(ours[i], fp32[i])) { m->add(fmt("%s %s[%zu] (fp32 state) = %s, fp32 run %s", kernel, out, i, show(ours[i]).c_str(), show(fp32[i]).c_str())); }
    }
}

static void test_kernels(int prec) {
    const char* pn = precision_name(prec);
    printf("\n[CPU kernels, --precision %s]\n", pn);
    rng_init(&krng, 7 + prec);
    const int B = 2, T = 8, C = 32, NH = 4, OC = 48, V = 50, Vp = 64;
    const size_t BT = (size_t)B * T;
    Misses rep, once, state;
    // run(f): f() with the given precision, then with fp32 (the outputs are the vectors f fills)
    auto both = [&](auto&& f) {
        backend_set_precision(prec);
        auto a = f();
        backend_set_precision(PREC_FP32);
        auto b = f();
        backend_set_precision(prec);
        return std::make_pair(a, b);
    };
    typedef std::vector<std::vector<float>> Outs;
    auto compare = [&](const char* kernel, const std::pair<Outs, Outs>& r, std::vector<const char*> names, std::vector<int> is_state) {
        for (size_t k = 0; k < names.size(); k++) {
            if (is_state[k]) {
                check_state(kernel, names[k], r.first[k], r.second[k], &state);
            } else {
                check_output(kernel, names[k], prec, r.first[k], r.second[k], &rep, &once);
            }
        }
    };
    size_t outputs = 0;
    // encoder
    {
        std::vector<int> tok(BT);
        for (auto& x : tok) { x = (int)(rng_u32(&krng) % V); }
        tok[3] = tok[5];   // a token twice: the backward's scatter adds
        std::vector<float> wte = randv((size_t)Vp * C, 1.0f, prec), wpe = randv((size_t)T * C, 1.0f, prec);
        std::vector<float> dout = randv(BT * C, 1.0f, prec), dwte0 = randv((size_t)Vp * C, 0.1f, prec), dwpe0 = randv((size_t)T * C, 0.1f, prec);
        auto r = both([&]() {
            std::vector<float> out(BT * C), dwte = dwte0, dwpe = dwpe0;
            encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
            encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
            return Outs{out, dwte, dwpe};
        });
        compare("encoder", r, {"out", "dwte", "dwpe"}, {0, 0, 0});
        outputs += BT * C + (size_t)Vp * C + (size_t)T * C;
    }
    // layernorm
    {
        std::vector<float> inp = randv(BT * C, 2.0f, prec), w = randv(C, 1.0f, prec), b = randv(C, 0.5f, prec);
        std::vector<float> dout = randv(BT * C, 1.0f, prec), dinp0 = randv(BT * C, 0.1f, prec);
        std::vector<float> dw0 = randv(C, 0.1f, prec), db0 = randv(C, 0.1f, prec);
        auto r = both([&]() {
            std::vector<float> out(BT * C), mean(BT), rstd(BT), dinp = dinp0, dw = dw0, db = db0;
            layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), B, T, C);
            layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(), rstd.data(), B, T, C);
            return Outs{out, mean, rstd, dinp, dw, db};
        });
        compare("layernorm", r, {"out", "mean", "rstd", "dinp (accumulated)", "dweight (accumulated)", "dbias (accumulated)"},
                {0, 1, 1, 0, 0, 0});
        outputs += 2 * BT * C + 2 * C;
    }
    // matmul with bias
    {
        std::vector<float> inp = randv(BT * C, 1.0f, prec), w = randv((size_t)OC * C, 0.2f, prec), b = randv(OC, 0.5f, prec);
        std::vector<float> dout = randv(BT * OC, 1.0f, prec), dw0 = randv((size_t)OC * C, 0.1f, prec), db0 = randv(OC, 0.1f, prec);
        auto r = both([&]() {
            std::vector<float> out(BT * OC), dinp(BT * C, 123.0f), dw = dw0, db = db0;
            matmul_forward(out.data(), inp.data(), w.data(), b.data(), B, T, C, OC);
            matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), B, T, C, OC);
            return Outs{out, dinp, dw, db};
        });
        compare("matmul", r, {"out", "dinp", "dweight (accumulated)", "dbias (accumulated)"}, {0, 0, 0, 0});
        outputs += BT * OC + BT * C + (size_t)OC * C + OC;
    }
    // attention
    {
        std::vector<float> inp = randv(BT * 3 * C, 1.0f, prec), dout = randv(BT * C, 1.0f, prec);
        auto r = both([&]() {
            std::vector<float> out(BT * C), att(attention_state_size(B, T, NH)), dinp(BT * 3 * C);
            attention_forward(out.data(), att.data(), inp.data(), B, T, C, NH);
            attention_backward(dinp.data(), dout.data(), inp.data(), att.data(), B, T, C, NH);
            return Outs{out, att, dinp};
        });
        compare("attention", r, {"out", "att (probabilities)", "dinp"}, {0, 1, 0});
        outputs += BT * C + BT * 3 * C;
    }
    // gelu and residual: elementwise
    {
        std::vector<float> inp = randv(BT * 4 * C, 3.0f, prec), inp2 = randv(BT * 4 * C, 1.0f, prec), dout = randv(BT * 4 * C, 1.0f, prec);
        auto r = both([&]() {
            std::vector<float> out(BT * 4 * C), dinp(BT * 4 * C), res(BT * 4 * C);
            gelu_forward(out.data(), inp.data(), BT * 4 * C);
            gelu_backward(dinp.data(), inp.data(), dout.data(), BT * 4 * C);
            residual_forward(res.data(), inp.data(), inp2.data(), BT * 4 * C);
            return Outs{out, dinp, res};
        });
        compare("gelu/residual", r, {"gelu out", "gelu dinp", "residual out"}, {0, 0, 0});
        outputs += 3 * BT * 4 * C;
    }
    // the classifier: the losses stay fp32, the logit gradients are floatX
    {
        std::vector<float> logits0 = randv(BT * Vp, 2.0f, prec), wts(BT);
        std::vector<int> targets(BT);
        for (size_t i = 0; i < BT; i++) { targets[i] = (int)(rng_u32(&krng) % V); wts[i] = (float)(i % 3); }
        auto r = both([&]() {
            std::vector<float> logits = logits0, losses(BT);
            fused_classifier(logits.data(), losses.data(), wts.data(), targets.data(), 1.0f / 7, B, T, V, Vp, 1);
            return Outs{logits, losses};
        });
        compare("classifier", r, {"dlogits", "losses"}, {0, 1});
        outputs += BT * Vp;
    }
    report(fmt("kernels (%s): all %zu floatX outputs of encoder, layernorm, matmul, attention, gelu, residual, classifier "
               "(forward and backward) are %s values", pn, outputs, pn), rep.n == 0, rep.n ? rep.text() : "");
    report(fmt("kernels (%s): each output = the fp32 kernel's output on the same inputs rounded once (accumulating "
               "outputs: fp32 sum added to the stored value, then rounded)", pn), once.n == 0, once.n ? once.text() : "");
    report(fmt("kernels (%s): the fp32 state (layernorm mean/rstd, attention probabilities, losses) is not rounded", pn),
           state.n == 0, state.n ? state.text() : "");

    // the counters: values that became 0 (flushed) or inf (overflowed), through gelu's output
    // (activations) and its backward (gradients)
    {
        float tiny = prec == PREC_FP16 ? 1e-9f : 1e-39f, big = prec == PREC_FP16 ? 1e5f : 3.4e38f;
        std::vector<float> inp(1000), dout(1000, 1.0f);
        for (size_t i = 0; i < inp.size(); i++) {
            inp[i] = i % 10 == 0 ? tiny * (float)(i + 1) / 1000.0f : i % 10 == 1 ? big : i % 10 == 2 ? 0.0f : (float)i / 300.0f - 1.5f;
        }
        backend_set_precision(PREC_FP32);
        std::vector<float> ref(inp.size()), dref(inp.size());
        gelu_forward(ref.data(), inp.data(), inp.size());
        gelu_backward(dref.data(), inp.data(), dout.data(), inp.size());
        double nz = 0, fl = 0, ov = 0, dnz = 0, dfl = 0, dov = 0;
        for (size_t i = 0; i < ref.size(); i++) {
            float r = round_to(prec, ref[i]), d = round_to(prec, dref[i]);
            nz += ref[i] != 0.0f; fl += ref[i] != 0.0f && r == 0.0f; ov += isfinite(ref[i]) && !isfinite(r);
            dnz += dref[i] != 0.0f; dfl += dref[i] != 0.0f && d == 0.0f; dov += isfinite(dref[i]) && !isfinite(d);
        }
        backend_set_precision(prec);
        CpuPrecision before = cpu_prec;
        std::vector<float> out(inp.size()), dinp(inp.size());
        gelu_forward(out.data(), inp.data(), inp.size());
        gelu_backward(dinp.data(), inp.data(), dout.data(), inp.size());
        double a_nz = cpu_prec.nonzero[ROUND_ACT] - before.nonzero[ROUND_ACT], a_fl = cpu_prec.flushed[ROUND_ACT] - before.flushed[ROUND_ACT];
        double a_ov = cpu_prec.overflowed[ROUND_ACT] - before.overflowed[ROUND_ACT];
        double g_nz = cpu_prec.nonzero[ROUND_GRAD] - before.nonzero[ROUND_GRAD], g_fl = cpu_prec.flushed[ROUND_GRAD] - before.flushed[ROUND_GRAD];
        double g_ov = cpu_prec.overflowed[ROUND_GRAD] - before.overflowed[ROUND_GRAD];
        int ok = a_nz == nz && a_fl == fl && a_ov == ov && g_nz == dnz && g_fl == dfl && g_ov == dov && fl > 0 && ov > 0;
        report(fmt("counters (%s): gelu forward: %g nonzero, %g flushed, %g overflowed; backward %g, %g, %g (expected "
                   "%g, %g, %g; %g, %g, %g)", pn, a_nz, a_fl, a_ov, g_nz, g_fl, g_ov, nz, fl, ov, dnz, dfl, dov), ok);
        // a ROUND_COPY (the host -> device copy of the parameters) is rounded but not counted
        before = cpu_prec;
        std::vector<float> dst(inp.size());
        copy_floats_to_device(dst.data(), ref.data(), ref.size());
        int copy_ok = cpu_prec.nonzero[0] == before.nonzero[0] && cpu_prec.nonzero[1] == before.nonzero[1] &&
                      cpu_prec.flushed[0] == before.flushed[0] && cpu_prec.overflowed[0] == before.overflowed[0];
        for (size_t i = 0; i < dst.size(); i++) { copy_ok &= same(dst[i], round_to(prec, ref[i])); }
        report(fmt("copy_floats_to_device (%s): rounds every value, counts nothing", pn), copy_ok);
    }

    // AdamW with master weights
    {
        const size_t n = 5000;
        std::vector<float> master0 = randv(n, 1.0f, PREC_FP32), grads = randv(n, 1e-2f, prec);
        std::vector<float> m0 = randv(n, 1e-3f, PREC_FP32), v0(n);
        for (size_t i = 0; i < n; i++) { v0[i] = 1e-6f * (1.0f + (float)(i % 7)); }
        std::vector<float> params(n, 0.0f), master = master0, m = m0, v = v0;
        std::vector<float> want = master0, wm = m0, wv = v0;
        const unsigned seed = 4242;
        backend_set_precision(prec);
        adamw_update(params.data(), master.data(), grads.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f, seed);
        adamw_host(want.data(), grads.data(), wm.data(), wv.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
        Misses mm, mp;
        size_t up = 0, down = 0;
        for (size_t i = 0; i < n; i++) {
            if (!same(master[i], want[i]) || !same(m[i], wm[i]) || !same(v[i], wv[i])) {
                mm.add(fmt("[%zu] master %s, adamw_host %s", i, show(master[i]).c_str(), show(want[i]).c_str()));
            }
            float e = prec == PREC_BF16 ? round_bf16_stochastic(master[i], stochastic_bits(i, seed)) : round_to(prec, master[i]);
            if (!same(params[i], e)) { mp.add(fmt("[%zu] param %s, expected %s (master %s)", i, show(params[i]).c_str(), show(e).c_str(), show(master[i]).c_str())); }
            up += fabsf(params[i]) > fabsf(master[i]);
            down += fabsf(params[i]) < fabsf(master[i]);
        }
        report(fmt("adamw (%s): the master weights and moments are the fp32 AdamW update", pn), mm.n == 0, mm.n ? mm.text() : "");
        report(prec == PREC_BF16 ? fmt("adamw (bf16): params[i] == round_bf16_stochastic(master[i], stochastic_bits(i, seed)) "
                                       "for all %zu (%zu rounded away from zero, %zu toward)", n, up, down)
                                 : fmt("adamw (%s): params[i] == round_%s(master[i]) for all %zu", pn, pn, n),
               mp.n == 0 && (prec != PREC_BF16 || (up > n / 4 && down > n / 4)), mp.n ? mp.text() : "");
    }
    backend_set_precision(PREC_FP32);
}

// test_precisioncpu [GROUP...]: all groups, or the named ones (bf16 fp16 e4m3 e5m2 e5m2_sat
// stochastic kernels); test/test_precision.sh runs its perturbed builds on the group concerned
int main(int argc, char** argv) {
    const Format formats[] = {
        // name       e  m  bias fn sat round           largest               smallest subnormal  smallest normal
        {"bf16",      8, 7, 127, 0, 0, round_bf16,     ldexp(255.0, 120),    ldexp(1.0, -133),   ldexp(1.0, -126)},
        {"fp16",      5, 10, 15, 0, 0, round_fp16,     65504.0,              ldexp(1.0, -24),    ldexp(1.0, -14)},
        {"e4m3",      4, 3, 7,   1, 1, round_e4m3,     448.0,                ldexp(1.0, -9),     ldexp(1.0, -6)},
        {"e5m2",      5, 2, 15,  0, 0, round_e5m2,     57344.0,              ldexp(1.0, -16),    ldexp(1.0, -14)},
        {"e5m2_sat",  5, 2, 15,  0, 1, round_e5m2_sat, 57344.0,              ldexp(1.0, -16),    ldexp(1.0, -14)},
    };
    const char* groups[] = {"bf16", "fp16", "e4m3", "e5m2", "e5m2_sat", "stochastic", "kernels"};
    for (int i = 1; i < argc; i++) {
        int known = 0;
        for (const char* g : groups) { known |= strcmp(argv[i], g) == 0; }
        if (!known) {
            fprintf(stderr, "usage: %s [bf16|fp16|e4m3|e5m2|e5m2_sat|stochastic|kernels]...\n", argv[0]);
            return 2;
        }
    }
    auto want = [&](const char* g) {
        if (argc == 1) { return true; }
        for (int i = 1; i < argc; i++) { if (strcmp(argv[i], g) == 0) { return true; } }
        return false;
    };
    report("E4M3_MAX and E5M2_MAX are 448 and 57344", E4M3_MAX == 448.0f && E5M2_MAX == 57344.0f);
    for (const Format& f : formats) {
        if (want(f.name)) { test_format(f); }
    }
    if (want("stochastic")) { test_stochastic(); }
    if (want("kernels")) {
        test_kernels(PREC_BF16);
        test_kernels(PREC_FP16);
    }
    printf("\n%s\n", failures ? "precision tests FAILED" : "precision tests passed");
    return failures ? 1 : 0;
}
