// The codec of gradient compression (llmc/parallel/compress_codec.h), on the host:
// 1. QSGD is unbiased, with the variance of its formula: for B = 1, 2, 4, 8 and 64 values of
//    every size (zero, tiny, on the grid, between grid points, negative, the largest), D = 20000
//    independent draws; per value |mean - a| <= 5 sigma / sqrt(D) with sigma^2 = h^2 f (1 - f)
//    (B = 1: h^2 - a^2), and s^2 = sum (d - a)^2 / D within 5 standard errors of sigma^2 (a
//    two-point distribution: Var(s^2) = (mu4 - sigma^4) / D, mu4 = w^4 p q (1 - 3 p q), w the
//    gap, p q = f(1-f)).
//    A value on the grid (sigma = 0) must come back exactly.
// 2. top-k picks the k largest |a| (against a full sort; ties: lower index), and decodes to
//    a at those indices and 0 elsewhere, also for a range [lo, hi) of the bucket.
// 3. random-k: k distinct indices in [0, n), ascending, the same for the same seed (every rank
//    draws them), different for another seed; k = n gives every index.
// 4. The B-bit packing round-trips every code for B = 1..16 (codes that straddle words).
// 5. Error feedback: e = a - D(C(a)) with sent + residual = accumulated exactly (TwoSum) on
//    every value for top-k, random-k and QSGD with the guard, also on tiny values far below
//    the grid step; without the guard QSGD has inexact values (so the guard is needed); sign:
//    |a - (d + e)| <= ulp(e)/2 and e = fl(a - d).
// 6. The payload sizes are the formula's: topk 8k, randk 4k, qsgd 4 (1 + ceil(nB/32)), sign
//    4 (1 + ceil(n/32)) bytes.
// Prints PASS/FAIL lines; exits 1 if any failed.
#include "../llmc/parallel/compress_codec.h"

static int failures = 0;
static void check(int ok, const char* name, const char* detail) {
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, ok ? "" : ": ", ok ? "" : detail);
    if (!ok) { failures++; }
}

// 64 test values of every kind, largest |a| = 1.5 (so h is the same for every draw)
static std::vector<float> test_values() {
    std::vector<float> a;
    Rng r;
    rng_init(&r, 7);
    a.push_back(0.0f);
    a.push_back(-1.5f);                  // the largest
    a.push_back(1e-30f);                 // far below any grid step
    a.push_back(-3e-9f);
    a.push_back(0.25f);                  // on the grid for most B
    a.push_back(-0.5f);
    a.push_back(1.0f);
    while (a.size() < 64) {
        float u = rng_uniform(&r) * 2.0f - 1.0f;
        float scale = powf(10.0f, -(float)(a.size() % 6));   // 1 .. 1e-5
        a.push_back(u * scale);
    }
    return a;
}

static void test_qsgd_unbiased(int bits) {
    std::vector<float> a = test_values();
    size_t n = a.size(), D = 20000;
    CompressSpec s = {CMP_QSGD, 1.0, bits};
    std::vector<uint32_t> p(cmp_payload_words(&s, n));
    std::vector<float> d(n);
    std::vector<double> sum(n, 0.0), sum2(n, 0.0);   // of d, and of (d - a)^2
    float h = 0.0f;
    for (size_t t = 0; t < D; t++) {
        cmp_encode(&s, a.data(), n, cmp_seed(0, t, 1), 0, p.data(), NULL, NULL);
        cmp_decode(&s, p.data(), n, NULL, 0, n, d.data());
        h = cmp_word_float(p[0]);
        for (size_t i = 0; i < n; i++) { sum[i] += d[i]; sum2[i] += ((double)d[i] - a[i]) * ((double)d[i] - a[i]); }
    }
    int L = cmp_levels(bits), bad_mean = 0, bad_var = 0;
    double worst = 0.0;
    char detail[256] = "", detail_var[256] = "";
    for (size_t i = 0; i < n; i++) {
        double x = a[i], mean = sum[i] / D, var = sum2[i] / D;   // around a: unbiased when E[d] = a
        double w, f;                     // the two points' gap and the probability of the upper one
        if (bits == 1) { w = 2.0 * h; f = 0.5 + 0.5 * x / h; }
        else { double c = fabs(x) / h; w = h; f = c - floor(c); }
        double pq = f * (1.0 - f), sigma2 = w * w * pq;
        double tol_mean = 5.0 * sqrt(sigma2 / D) + 1e-12 * fabs(x);
        double mu4 = w * w * w * w * pq * (1.0 - 3.0 * pq);
        double tol_var = 5.0 * sqrt(std::max(0.0, mu4 - sigma2 * sigma2) / D) + 1e-9 * w * w;
        double z = sigma2 > 0 ? fabs(mean - x) / sqrt(sigma2 / D) : (mean == x ? 0.0 : INFINITY);
        worst = std::max(worst, z);
        if (fabs(mean - x) > tol_mean) {
            bad_mean++;
            snprintf(detail, sizeof(detail), "a = %.9g: mean %.9g, |mean - a| %.3g > %.3g", x, mean, fabs(mean - x), tol_mean);
        }
        if (fabs(var - sigma2) > tol_var) {
            bad_var++;
            snprintf(detail_var, sizeof(detail_var), "a = %.9g: variance %.6g, formula %.6g, tolerance %.3g", x, var, sigma2, tol_var);
        }
    }
    char name[200];
    snprintf(name, sizeof(name), "qsgd:%d unbiased over %zu draws on %zu values (h = %g, %d levels): |mean - a| <= 5 sigma/sqrt(D) "
             "(largest %.2f sigma/sqrt(D))", bits, D, n, h, L, worst);
    check(bad_mean == 0, name, detail);
    snprintf(name, sizeof(name), "qsgd:%d variance = h^2 f (1-f)%s within 5 standard errors on every value", bits,
             bits == 1 ? " (B = 1: h^2 - a^2)" : "");
    check(bad_var == 0, name, detail_var);
}

static void test_topk() {
    size_t n = 1000, k = 37;
    std::vector<float> a(n);
    Rng r;
    rng_init(&r, 3);
    for (size_t i = 0; i < n; i++) { a[i] = rng_uniform(&r) - 0.5f; }
    a[10] = 0.75f; a[20] = -0.75f;                    // a tie at the top
    CompressSpec s = {CMP_TOPK, (double)k / n, 0};
    check(cmp_k(&s, n) == k, "top-k: k = ceil(R n)", "");
    std::vector<uint32_t> p(cmp_payload_words(&s, n)), idx(n), scratch(n);
    cmp_encode(&s, a.data(), n, 0, 0, p.data(), idx.data(), scratch.data());
    std::vector<uint32_t> order(n);
    for (size_t i = 0; i < n; i++) { order[i] = (uint32_t)i; }
    std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) { return fabsf(a[x]) > fabsf(a[y]); });
    std::vector<uint32_t> want(order.begin(), order.begin() + k);
    std::sort(want.begin(), want.end());
    int same = memcmp(want.data(), p.data() + k, k * 4) == 0;
    check(same, "top-k picks the k largest |a| (against a full sort), indices ascending in the payload", "different indices");
    std::vector<float> d(n), part(300);
    cmp_decode(&s, p.data(), n, NULL, 0, n, d.data());
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        int sent = std::binary_search(want.begin(), want.end(), (uint32_t)i);
        if (d[i] != (sent ? a[i] : 0.0f)) { ok = 0; }
    }
    cmp_decode(&s, p.data(), n, NULL, 500, 800, part.data());
    for (size_t i = 0; i < 300; i++) { if (part[i] != d[500 + i]) { ok = 0; } }
    check(ok, "top-k decodes to a on the k indices and 0 elsewhere (whole bucket and the range [500, 800))", "wrong values");
}

static void test_randk() {
    size_t n = 5000, k = 123;
    std::vector<uint32_t> i1(n), i2(n), i3(n), scratch(n);
    cmp_randk_select(n, k, 42, i1.data(), scratch.data());
    cmp_randk_select(n, k, 42, i2.data(), scratch.data());
    cmp_randk_select(n, k, 43, i3.data(), scratch.data());
    int ok = 1;
    for (size_t j = 0; j < k; j++) {
        if (i1[j] >= n || (j > 0 && i1[j] <= i1[j - 1])) { ok = 0; }
    }
    check(ok, "random-k: k distinct indices in [0, n), ascending", "");
    check(memcmp(i1.data(), i2.data(), k * 4) == 0, "random-k: the same seed gives the same indices (every rank)", "");
    check(memcmp(i1.data(), i3.data(), k * 4) != 0, "random-k: another seed, other indices", "");
    cmp_randk_select(n, n, 42, i1.data(), scratch.data());
    ok = 1;
    for (size_t j = 0; j < n; j++) { if (i1[j] != j) { ok = 0; } }
    check(ok, "random-k with k = n: every index", "");
}

static void test_bits() {
    int ok = 1;
    Rng r;
    rng_init(&r, 5);
    for (int bits = 1; bits <= 16; bits++) {
        size_t n = 333;
        std::vector<uint32_t> w(1 + ceil_div(n * bits, (size_t)32), 0), codes(n);
        for (size_t i = 0; i < n; i++) {
            codes[i] = rng_u32(&r) & ((1u << bits) - 1);
            cmp_put_bits(w.data(), i, bits, codes[i]);
        }
        for (size_t i = 0; i < n; i++) { if (cmp_get_bits(w.data(), i, bits) != codes[i]) { ok = 0; } }
    }
    check(ok, "B-bit packing round-trips 333 random codes for every B in 1..16", "");
}

// residual and check for one method on the test values (and a spread of tiny ones)
static size_t ef_conserved(const CompressSpec* s, int guard, size_t* n_out, float* max_err) {
    std::vector<float> a = test_values();
    for (int e = -40; e <= 0; e++) { a.push_back(ldexpf(1.2345678f, e)); a.push_back(-ldexpf(1.0000001f, e)); }
    size_t n = a.size();
    std::vector<uint32_t> p(cmp_payload_words(s, n)), idx(n), scratch(n);
    std::vector<float> d(n), e(n);
    size_t ok = 0;
    *max_err = 0.0f;
    for (int t = 0; t < 50; t++) {
        cmp_encode(s, a.data(), n, cmp_seed(1, t, 1), guard, p.data(), idx.data(), scratch.data());
        cmp_decode(s, p.data(), n, idx.data(), 0, n, d.data());
        ok += cmp_residual(s, a.data(), d.data(), idx.data(), e.data(), n, max_err);
    }
    *n_out = 50 * n;
    return ok;
}

static void test_error_feedback() {
    CompressSpec specs[] = {{CMP_TOPK, 0.1, 0}, {CMP_RANDK, 0.3, 0}, {CMP_QSGD, 1.0, 2}, {CMP_QSGD, 1.0, 8},
                            {CMP_QSGD, 1.0, 16}, {CMP_SIGN, 1.0, 0}, {CMP_QSGD, 1.0, 1}};
    for (const CompressSpec& s : specs) {
        size_t n;
        float mx;
        size_t ok = ef_conserved(&s, 1, &n, &mx);
        char name[160];
        if (cmp_exact(&s)) {
            snprintf(name, sizeof(name), "error feedback %s:%g: sent + residual = accumulated exactly on all %zu values",
                     CMP_NAMES[s.method], s.method == CMP_QSGD ? (double)s.bits : s.ratio, n);
        } else {
            snprintf(name, sizeof(name), "error feedback %s%s: e = fl(a - d), |a - (d + e)| <= ulp(e)/2 on all %zu values "
                     "(largest %.2e)", CMP_NAMES[s.method], s.method == CMP_QSGD ? ":1" : "", n, mx);
        }
        check(ok == n, name, "values not conserved");
    }
    CompressSpec q = {CMP_QSGD, 1.0, 8};
    size_t n;
    float mx;
    size_t ok = ef_conserved(&q, 0, &n, &mx);
    char name[160];
    snprintf(name, sizeof(name), "qsgd:8 without the guard: a - d inexact on %zu of %zu values (the guard is needed)", n - ok, n);
    check(ok < n, name, "no inexact value: the test values do not exercise the guard");
}

static void test_sizes() {
    int ok = 1;
    for (size_t n : {1, 31, 32, 33, 1000, 123457}) {
        CompressSpec t = {CMP_TOPK, 0.01, 0}, r = {CMP_RANDK, 0.01, 0}, q = {CMP_QSGD, 1.0, 3}, g = {CMP_SIGN, 1.0, 0};
        size_t k = (size_t)ceil(0.01 * n);
        if (k < 1) { k = 1; }
        if (4 * cmp_payload_words(&t, n) != 8 * k || 4 * cmp_payload_words(&r, n) != 4 * k) { ok = 0; }
        if (4 * cmp_payload_words(&q, n) != 4 * (1 + (n * 3 + 31) / 32)) { ok = 0; }
        if (4 * cmp_payload_words(&g, n) != 4 * (1 + (n + 31) / 32)) { ok = 0; }
    }
    check(ok, "payload bytes: topk 8k, randk 4k, qsgd 4 (1 + ceil(nB/32)), sign 4 (1 + ceil(n/32))", "");
}

int main() {
    (void)CMP_NAMES;
    for (int bits : {1, 2, 4, 8}) { test_qsgd_unbiased(bits); }
    test_topk();
    test_randk();
    test_bits();
    test_error_feedback();
    test_sizes();
    printf("%s\n", failures ? "SOME TESTS FAILED" : "all compression codec tests passed");
    return failures ? 1 : 0;
}
