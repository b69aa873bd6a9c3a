// Unit tests of the CPU kernels (llmc/cpu), each against a reference written here, in double
// precision, from the formulas (it shares no code with llmc/cpu). For each layer one function
// computes the forward and the backward, and beside every value its magnitude (below).
// Three kinds of check:
//   1. the reference's backward against central differences of the reference's forward, all in
//      double: this anchors the formulas written here to the math (tolerance 1e-7);
//   2. every output of a float kernel, forward and backward, against the reference, element by
//      element, with a tolerance derived from float rounding (below). This is the pass/fail of
//      each kernel: a wrong constant, a dropped or rescaled term, an off-by-one range fails it
//      (doc/gpt2-cpu.md, "The kernel unit tests", lists the perturbations tried and their errors);
//   3. AdamW and the global norm against double-precision formulas, and the kernels that reduce
//      over rows (encoder, layernorm, matmul, norm) bit-identical with 1 and 2 threads.
// (These tests used to compare the float kernels' backward with central differences of their
// float forward, which needs a tolerance of ~1e-2: GELU's backward with 0.040 in place of
// 0.044715, 2.5e-3 off, passed. Checks 1 and 2 together cover what that check did.)
//
// The tolerance of check 2. u = 2^-24 is float's unit roundoff. A float sum of n terms, added in
// any order, errs by at most about n u sum|terms| (Higham, "Accuracy and Stability of Numerical
// Algorithms", sec. 4.2); a product or quotient carries the relative errors of its factors plus
// u; exp turns its argument's absolute error into a relative error. So an output errs by at most
//   d u mag,  where
//   mag = the output's formula evaluated on absolute values (|terms| summed, every subtraction
//         an addition), computed by the reference beside the value, so that cancellation does
//         not shrink the bound (an element whose mag is 0 must come out exactly 0);
//   d   = the lengths of the sums along the output's chain of operations, plus 16 for its few
//         elementwise operations (expf, sqrtf are within an ulp or two).
// Each check demands |kernel - reference| <= 2 d u mag for every element (2: a margin for the
// first-order analysis) and states its d. It prints err = max |kernel - reference| / mag and the
// tolerance 2 d u. For the shapes here the tolerances are 2e-6 to 1e-4 and the errors 3e-9 to
// 5e-7, while a term off by 1e-3 makes an error of about 1e-3.
// Prints PASS/FAIL per check; exits 1 if any failed.
#include <vector>
#include <string>
#include <functional>
#include "../llmc/common.h"
#include "../llmc/backend.h"
#include "../llmc/rand.h"

typedef std::vector<double> vec;

static int failures = 0;
static Rng rng;
static const double U = 1.0 / 16777216.0;   // 2^-24, float's unit roundoff

static void report(const char* name, int ok, const char* detail) {
    printf("%s %-58s %s\n", ok ? "PASS" : "FAIL", name, detail);
    if (!ok) { failures++; }
}

static std::vector<float> randn(size_t n, float std = 1.0f) {
    std::vector<float> v(n);
    rng_normal(&rng, v.data(), n, 0.0f, std);
    return v;
}

static vec to_double(const std::vector<float>& v) { return vec(v.begin(), v.end()); }

static double dot(const vec& a, const vec& b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++) { s += a[i] * b[i]; }
    return s;
}

// A reference tensor: each element's exact value and its magnitude mag (see the top).
struct Ref {
    vec v, mag;
    explicit Ref(size_t n) : v(n, 0.0), mag(n, 0.0) {}
    explicit Ref(const std::vector<float>& start) : v(to_double(start)), mag(start.size()) {   // an accumulator
        for (size_t i = 0; i < v.size(); i++) { mag[i] = fabs(v[i]); }
    }
};

// Check 2 for one test: float tensors against their references, each with its chain length d.
struct Tight {
    double worst = 0.0;   // the largest err / tolerance
    std::string detail;
    void add(const char* what, const float* out, const Ref& ref, double d) {
        double err = 0.0, tol = 2.0 * d * U;
        for (size_t i = 0; i < ref.v.size(); i++) {
            double e = fabs((double)out[i] - ref.v[i]);
            double rel = e == 0.0 ? 0.0 : (ref.mag[i] > 0.0 && e == e) ? e / ref.mag[i] : INFINITY;   // NaN: inf
            err = fmax(err, rel);
        }
        worst = fmax(worst, err / tol);
        char s[96];
        snprintf(s, sizeof(s), "%s%s err %.1e tol %.1e", detail.empty() ? "" : ", ", what, err, tol);
        detail += s;
    }
    void report(const char* name) { ::report(name, worst <= 1.0, detail.c_str()); }
};

// Check 1: the reference's gradient of loss() with respect to x against central differences, at
// every entry of x, in double: h = 1e-5 leaves a truncation error of ~h^2 = 1e-10 and a rounding
// error of ~1e-16 |loss| / h = 1e-10 (relative to the largest gradient; inputs are O(1)).
static double fd_error(vec& x, const vec& grad, const std::function<double()>& loss) {
    const double h = 1e-5;
    double max_grad = 1e-300, max_err = 0.0;
    for (double g : grad) { max_grad = fmax(max_grad, fabs(g)); }
    for (size_t i = 0; i < x.size(); i++) {
        double saved = x[i];
        x[i] = saved + h; double lp = loss();
        x[i] = saved - h; double lm = loss();
        x[i] = saved;
        double e = fabs((lp - lm) / (2.0 * h) - grad[i]);
        if (e != e) { return INFINITY; }   // NaN
        max_err = fmax(max_err, e);
    }
    return max_err / max_grad;
}

static void report_fd(const char* name, double e) {
    char detail[64];
    snprintf(detail, sizeof(detail), "rel err %.1e tol 1e-07", e);
    report(name, e <= 1e-7, detail);
}

// ---------------------------------------------------------------------------------------------
// matmul: out = bias + inp . weight^T,  dinp = dout . weight,  dweight += dout^T . inp,
//         dbias += sum over rows of dout.   inp (BT,C), weight (OC,C), out (BT,OC); bias may be empty.
struct MatmulRef { Ref out, dinp, dweight, dbias; };

static MatmulRef ref_matmul(const vec& inp, const vec& w, const vec& bias, const vec& dout, const Ref& dweight,
                            const Ref& dbias, int BT, int C, int OC) {
    MatmulRef r{Ref(BT * OC), Ref(BT * C), dweight, dbias};
    for (int bt = 0; bt < BT; bt++) {
        for (int o = 0; o < OC; o++) {
            double s = bias.empty() ? 0.0 : bias[o], m = fabs(s);
            for (int c = 0; c < C; c++) { s += inp[bt * C + c] * w[o * C + c]; m += fabs(inp[bt * C + c] * w[o * C + c]); }
            r.out.v[bt * OC + o] = s;
            r.out.mag[bt * OC + o] = m;
        }
    }
    for (int bt = 0; bt < BT; bt++) {
        for (int o = 0; o < OC; o++) {
            double g = dout[bt * OC + o];
            for (int c = 0; c < C; c++) {
                r.dinp.v[bt * C + c] += g * w[o * C + c];
                r.dinp.mag[bt * C + c] += fabs(g * w[o * C + c]);
                r.dweight.v[o * C + c] += g * inp[bt * C + c];
                r.dweight.mag[o * C + c] += fabs(g * inp[bt * C + c]);
            }
            if (!bias.empty()) { r.dbias.v[o] += g; r.dbias.mag[o] += fabs(g); }
        }
    }
    return r;
}

static void test_matmul() {
    int shapes[][4] = {{1, 1, 1, 1}, {1, 3, 5, 7}, {2, 17, 33, 65}, {1, 100, 129, 257}, {4, 64, 768, 96}};
    for (auto& s : shapes) {
        int B = s[0], T = s[1], C = s[2], OC = s[3], BT = B * T;
        for (int with_bias = 0; with_bias <= 1; with_bias++) {
            std::vector<float> inp = randn(BT * C), w = randn(OC * C), bias = randn(OC), dout = randn(BT * OC), out(BT * OC);
            // the gradients start non-zero: dweight and dbias must ACCUMULATE, dinp must OVERWRITE
            std::vector<float> dinp = randn(BT * C), dw = randn(OC * C), db = randn(OC);
            MatmulRef r = ref_matmul(to_double(inp), to_double(w), with_bias ? to_double(bias) : vec(), to_double(dout),
                                     Ref(dw), Ref(db), BT, C, OC);
            matmul_forward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : NULL, B, T, C, OC);
            matmul_backward(dinp.data(), dw.data(), with_bias ? db.data() : NULL, dout.data(), inp.data(), w.data(), B, T, C, OC);
            // d = the length of the one sum: C products (+ bias), OC products, BT products + the start
            Tight t;
            t.add("fwd", out.data(), r.out, C + 1 + 16);
            t.add("dinp", dinp.data(), r.dinp, OC + 16);
            t.add("dweight", dw.data(), r.dweight, BT + 1 + 16);
            if (with_bias) { t.add("dbias", db.data(), r.dbias, BT + 1 + 16); }
            char name[96];
            snprintf(name, sizeof(name), "matmul vs double, BT=%d C=%d OC=%d bias=%d", BT, C, OC, with_bias);
            t.report(name);
        }
    }
    {   // the naive versions (the benchmark's reference), at one awkward shape
        int B = 2, T = 17, C = 33, OC = 65, BT = B * T;
        std::vector<float> inp = randn(BT * C), w = randn(OC * C), bias = randn(OC), dout = randn(BT * OC), out(BT * OC);
        std::vector<float> dinp = randn(BT * C), dw = randn(OC * C), db = randn(OC);
        MatmulRef r = ref_matmul(to_double(inp), to_double(w), to_double(bias), to_double(dout), Ref(dw), Ref(db), BT, C, OC);
        matmul_forward_naive(out.data(), inp.data(), w.data(), bias.data(), B, T, C, OC);
        matmul_backward_naive(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), B, T, C, OC);
        Tight t;
        t.add("fwd", out.data(), r.out, C + 1 + 16);
        t.add("dinp", dinp.data(), r.dinp, OC + 16);
        t.add("dweight", dw.data(), r.dweight, BT + 1 + 16);
        t.add("dbias", db.data(), r.dbias, BT + 1 + 16);
        t.report("matmul_*_naive vs double, BT=34 C=33 OC=65 bias=1");
    }
    {   // check 1 for the reference
        int BT = 6, C = 5, OC = 4;
        vec inp = to_double(randn(BT * C)), w = to_double(randn(OC * C)), bias = to_double(randn(OC)), R = to_double(randn(BT * OC));
        auto loss = [&]() { return dot(ref_matmul(inp, w, bias, R, Ref(OC * C), Ref(OC), BT, C, OC).out.v, R); };
        MatmulRef r = ref_matmul(inp, w, bias, R, Ref(OC * C), Ref(OC), BT, C, OC);
        double e = fmax(fd_error(inp, r.dinp.v, loss), fd_error(w, r.dweight.v, loss));
        report_fd("matmul reference (double) vs finite differences", fmax(e, fd_error(bias, r.dbias.v, loss)));
    }
}

// ---------------------------------------------------------------------------------------------
// layernorm over C channels of N rows, eps = 1e-5, biased variance:
//   xhat = (x - mean) * rstd,  out = xhat * w + b
//   g = dout * w,  dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
//   dw += sum over rows of dout * xhat,  db += sum over rows of dout
struct LayernormRef { Ref out, dinp, dw, db; };

static LayernormRef ref_layernorm(const vec& x, const vec& w, const vec& b, const vec& dout, const Ref& dinp,
                                  const Ref& dw, const Ref& db, int N, int C) {
    LayernormRef r{Ref(N * C), dinp, dw, db};
    for (int i = 0; i < N; i++) {
        const double* xi = &x[i * C];
        const double* dy = &dout[i * C];
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) { mean += xi[c] / C; }
        for (int c = 0; c < C; c++) { var += (xi[c] - mean) * (xi[c] - mean) / C; }
        double rstd = 1.0 / sqrt(var + 1e-5);
        double g_mean = 0.0, gx_mean = 0.0, g_mean_mag = 0.0, gx_mean_mag = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (xi[c] - mean) * rstd, xhat_mag = (fabs(xi[c]) + fabs(mean)) * rstd;
            g_mean += dy[c] * w[c] / C;
            g_mean_mag += fabs(dy[c] * w[c]) / C;
            gx_mean += dy[c] * w[c] * xhat / C;
            gx_mean_mag += fabs(dy[c] * w[c]) * xhat_mag / C;
        }
        for (int c = 0; c < C; c++) {
            double xhat = (xi[c] - mean) * rstd, xhat_mag = (fabs(xi[c]) + fabs(mean)) * rstd;
            r.out.v[i * C + c] = xhat * w[c] + b[c];
            r.out.mag[i * C + c] = xhat_mag * fabs(w[c]) + fabs(b[c]);
            r.dinp.v[i * C + c] += rstd * (dy[c] * w[c] - g_mean - xhat * gx_mean);
            r.dinp.mag[i * C + c] += rstd * (fabs(dy[c] * w[c]) + g_mean_mag + xhat_mag * gx_mean_mag);
            r.dw.v[c] += dy[c] * xhat;
            r.dw.mag[c] += fabs(dy[c]) * xhat_mag;
            r.db.v[c] += dy[c];
            r.db.mag[c] += fabs(dy[c]);
        }
    }
    return r;
}

static void test_layernorm() {
    int B = 2, T = 3, C = 40, N = B * T;
    std::vector<float> x = randn(N * C, 2.0f), w = randn(C), b = randn(C), dout = randn(N * C);
    for (auto& v : x) { v += 1.0f; }   // rows with a non-zero mean
    std::vector<float> out(N * C), mean(N), rstd(N);
    std::vector<float> dx = randn(N * C), dw = randn(C), db = randn(C);   // all three ACCUMULATE
    LayernormRef r = ref_layernorm(to_double(x), to_double(w), to_double(b), to_double(dout), Ref(dx), Ref(dw), Ref(db), N, C);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), B, T, C);
    layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), B, T, C);
    // d: the sums of the mean and the variance (C each), then for dinp the mean of g * xhat (C),
    // for dw and db the sum over the N rows
    Tight fwd, bwd;
    fwd.add("out", out.data(), r.out, 2 * C + 16);
    fwd.report("layernorm forward vs double");
    bwd.add("dinp", dx.data(), r.dinp, 3 * C + 16);
    bwd.add("dw", dw.data(), r.dw, 2 * C + N + 1 + 16);
    bwd.add("db", db.data(), r.db, N + 1 + 16);
    bwd.report("layernorm backward vs double");
    // check 1 for the reference
    vec xd = to_double(x), wd = to_double(w), bd = to_double(b), R = to_double(dout);
    auto grads = [&]() { return ref_layernorm(xd, wd, bd, R, Ref(N * C), Ref(C), Ref(C), N, C); };
    auto loss = [&]() { return dot(grads().out.v, R); };
    LayernormRef g = grads();
    double e = fmax(fd_error(xd, g.dinp.v, loss), fd_error(wd, g.dw.v, loss));
    report_fd("layernorm reference (double) vs finite differences", fmax(e, fd_error(bd, g.db.v, loss)));
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation: out = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)
//   dout/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3 * 0.044715 x^2),   th = tanh(...)
struct GeluRef { Ref out, dinp; };

static GeluRef ref_gelu(const vec& x, const vec& dout) {
    const double k = sqrt(2.0 / M_PI), a = 0.044715;
    GeluRef r{Ref(x.size()), Ref(x.size())};
    for (size_t i = 0; i < x.size(); i++) {
        double xi = x[i], th = tanh(k * (xi + a * xi * xi * xi)), du = k * (1.0 + 3.0 * a * xi * xi);
        r.out.v[i] = 0.5 * xi * (1.0 + th);
        r.out.mag[i] = fabs(xi);                                     // |th| <= 1
        r.dinp.v[i] = (0.5 * (1.0 + th) + 0.5 * xi * (1.0 - th * th) * du) * dout[i];
        r.dinp.mag[i] = (1.0 + fabs(xi) * du) * fabs(dout[i]);
    }
    return r;
}

static void test_gelu() {
    size_t N = 200;
    std::vector<float> x = randn(N, 2.0f), dout = randn(N), out(N), dx(N);
    float tails[] = {-12.0f, -6.0f, 6.0f, 12.0f};   // exp(2u) underflows / overflows at +-12
    for (int i = 0; i < 4; i++) { x[i] = tails[i]; }
    GeluRef r = ref_gelu(to_double(x), to_double(dout));
    gelu_forward(out.data(), x.data(), N);
    gelu_backward(dx.data(), x.data(), dout.data(), N);
    // d: no sums; tanh through expf and a division (its absolute error, ~6u, is what mag bounds)
    Tight fwd, bwd;
    fwd.add("out", out.data(), r.out, 16);
    fwd.report("gelu forward vs double");
    bwd.add("dinp", dx.data(), r.dinp, 16);
    bwd.report("gelu backward vs double");
    vec xd = to_double(x), R = to_double(dout);
    auto loss = [&]() { return dot(ref_gelu(xd, R).out.v, R); };
    report_fd("gelu reference (double) vs finite differences", fd_error(xd, ref_gelu(xd, R).dinp.v, loss));
}

// ---------------------------------------------------------------------------------------------
// causal attention, per batch b and head h (hs = C / NH channels of each of q | k | v):
//   S[t][t2] = q_t . k_t2 / sqrt(hs),  P = softmax over t2 <= t,  out_t = sum_{t2 <= t} P[t][t2] v_t2
//   dv_t2 = sum_{t >= t2} P[t][t2] dout_t,  dP[t][t2] = dout_t . v_t2,
//   dS[t][t2] = P[t][t2] (dP[t][t2] - sum_{t3 <= t} P[t][t3] dP[t][t3]),
//   dq_t = sum_{t2 <= t} dS[t][t2] k_t2 / sqrt(hs),   dk_t2 = sum_{t >= t2} dS[t][t2] q_t / sqrt(hs)
struct AttentionRef { Ref out, dinp; double score_mag; };   // score_mag: the largest sum |q_i k_i| / sqrt(hs)

static AttentionRef ref_attention(const vec& qkv, const vec& dout, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    double scale = 1.0 / sqrt((double)hs);
    AttentionRef r{Ref(B * T * C), Ref(B * T * C3), 0.0};
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            auto q = [&](int t) { return &qkv[(b * T + t) * C3 + h * hs]; };
            auto k = [&](int t) { return &qkv[(b * T + t) * C3 + C + h * hs]; };
            auto v = [&](int t) { return &qkv[(b * T + t) * C3 + 2 * C + h * hs]; };
            auto at = [&](Ref& ref, int t, int part, int i) -> double& { return ref.v[(b * T + t) * C3 + part * C + h * hs + i]; };
            auto mag = [&](Ref& ref, int t, int part, int i) -> double& { return ref.mag[(b * T + t) * C3 + part * C + h * hs + i]; };
            for (int t = 0; t < T; t++) {
                const double* dO = &dout[(b * T + t) * C + h * hs];
                vec P(t + 1), dP(t + 1), dP_mag(t + 1);
                double mx = -INFINITY, sum = 0.0, rowdot = 0.0, rowdot_mag = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    double s = 0.0, s_mag = 0.0;
                    for (int i = 0; i < hs; i++) { s += q(t)[i] * k(t2)[i] * scale; s_mag += fabs(q(t)[i] * k(t2)[i]) * scale; }
                    P[t2] = s;
                    mx = fmax(mx, s);
                    r.score_mag = fmax(r.score_mag, s_mag);
                }
                for (int t2 = 0; t2 <= t; t2++) { P[t2] = exp(P[t2] - mx); sum += P[t2]; }
                for (int t2 = 0; t2 <= t; t2++) { P[t2] /= sum; }
                for (int t2 = 0; t2 <= t; t2++) {
                    for (int i = 0; i < hs; i++) {
                        r.out.v[(b * T + t) * C + h * hs + i] += P[t2] * v(t2)[i];
                        r.out.mag[(b * T + t) * C + h * hs + i] += P[t2] * fabs(v(t2)[i]);
                        at(r.dinp, t2, 2, i) += P[t2] * dO[i];            // dv
                        mag(r.dinp, t2, 2, i) += P[t2] * fabs(dO[i]);
                        dP[t2] += dO[i] * v(t2)[i];
                        dP_mag[t2] += fabs(dO[i] * v(t2)[i]);
                    }
                    rowdot += P[t2] * dP[t2];
                    rowdot_mag += P[t2] * dP_mag[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    double dS = P[t2] * (dP[t2] - rowdot) * scale, dS_mag = P[t2] * (dP_mag[t2] + rowdot_mag) * scale;
                    for (int i = 0; i < hs; i++) {
                        at(r.dinp, t, 0, i) += dS * k(t2)[i];             // dq
                        mag(r.dinp, t, 0, i) += dS_mag * fabs(k(t2)[i]);
                        at(r.dinp, t2, 1, i) += dS * q(t)[i];             // dk
                        mag(r.dinp, t2, 1, i) += dS_mag * fabs(q(t)[i]);
                    }
                }
            }
        }
    }
    return r;
}

static void test_attention() {
    int B = 2, T = 7, C = 12, NH = 3, hs = C / NH;
    std::vector<float> qkv = randn(B * T * 3 * C), dout = randn(B * T * C), out(B * T * C), att(attention_state_size(B, T, NH));
    std::vector<float> dqkv = randn(B * T * 3 * C);   // garbage: backward must overwrite it
    AttentionRef r = ref_attention(to_double(qkv), to_double(dout), B, T, C, NH);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    // d: a score sums hs products, and exp turns its absolute error (hs u score_mag, plus the
    // rounding of s - max) into the relative error of P, as does the softmax's sum of T terms:
    // d_P = (hs + 2) score_mag + T. out sums T terms of P v. dS has P twice (in P and in the row
    // sum), dP (hs) and the row sum (T); dq and dk sum T of them.
    double d_P = (hs + 2) * r.score_mag + T;
    Tight fwd, bwd;
    fwd.add("out", out.data(), r.out, d_P + T + 16);
    fwd.report("causal attention forward vs double");
    bwd.add("dqkv", dqkv.data(), r.dinp, 2 * d_P + hs + 2 * T + 16);
    bwd.report("causal attention backward vs double");
    vec x = to_double(qkv), R = to_double(dout);
    auto loss = [&]() { return dot(ref_attention(x, R, B, T, C, NH).out.v, R); };
    report_fd("attention reference (double) vs finite differences", fd_error(x, ref_attention(x, R, B, T, C, NH).dinp.v, loss));
}

// ---------------------------------------------------------------------------------------------
// encoder: out[b,t] = wte[inp[b,t]] + wpe[t],  dwte[inp[b,t]] += dout[b,t],  dwpe[t] += sum_b dout[b,t]
struct EncoderRef { Ref out, dwte, dwpe; };

static EncoderRef ref_encoder(const std::vector<int>& inp, const vec& wte, const vec& wpe, const vec& dout,
                              const Ref& dwte, const Ref& dwpe, int B, int T, int C) {
    EncoderRef r{Ref(B * T * C), dwte, dwpe};
    for (int i = 0; i < B * T; i++) {
        for (int c = 0; c < C; c++) {
            int tok = inp[i] * C + c, pos = (i % T) * C + c;
            r.out.v[i * C + c] = wte[tok] + wpe[pos];
            r.out.mag[i * C + c] = fabs(wte[tok]) + fabs(wpe[pos]);
            r.dwte.v[tok] += dout[i * C + c];
            r.dwte.mag[tok] += fabs(dout[i * C + c]);
            r.dwpe.v[pos] += dout[i * C + c];
            r.dwpe.mag[pos] += fabs(dout[i * C + c]);
        }
    }
    return r;
}

static void test_encoder() {
    int B = 3, T = 5, C = 40, V = 5;   // tokens 0..3 only: repeated rows of wte, and row 4 unused
    std::vector<int> inp(B * T);
    for (auto& t : inp) { t = (int)(rng_u32(&rng) % (V - 1)); }
    std::vector<float> wte = randn(V * C), wpe = randn(T * C), out(B * T * C), dout = randn(B * T * C);
    std::vector<float> dwte = randn(V * C), dwpe = randn(T * C);   // both ACCUMULATE
    EncoderRef r = ref_encoder(inp, to_double(wte), to_double(wpe), to_double(dout), Ref(dwte), Ref(dwpe), B, T, C);
    encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
    // d: dwte sums up to B*T rows onto its start, dwpe B rows
    Tight fwd, bwd;
    fwd.add("out", out.data(), r.out, 16);
    fwd.report("encoder forward vs double");
    bwd.add("dwte", dwte.data(), r.dwte, B * T + 1 + 16);
    bwd.add("dwpe", dwpe.data(), r.dwpe, B + 1 + 16);
    bwd.report("encoder backward vs double (repeated tokens)");
    vec wted = to_double(wte), wped = to_double(wpe), R = to_double(dout);
    auto grads = [&]() { return ref_encoder(inp, wted, wped, R, Ref(V * C), Ref(T * C), B, T, C); };
    auto loss = [&]() { return dot(grads().out.v, R); };
    EncoderRef g = grads();
    report_fd("encoder reference (double) vs finite differences", fmax(fd_error(wted, g.dwte.v, loss), fd_error(wped, g.dwpe.v, loss)));
}

// ---------------------------------------------------------------------------------------------
// fused classifier over the V real columns of rows of width Vp, with loss weights w_i:
//   loss_i = w_i (logsumexp(logits_i) - logits_i[target_i]),  dlogits_i = dloss w_i (softmax(logits_i) - onehot)
// and dlogits = 0 in the padded columns V..Vp-1.
struct ClassifierRef { Ref losses, dlogits; double range; };   // range: the largest max - min of a row

static ClassifierRef ref_classifier(const vec& logits, const vec& weights, const std::vector<int>& targets, double dloss,
                                    int N, int V, int Vp) {
    ClassifierRef r{Ref(N), Ref(N * Vp), 0.0};
    for (int i = 0; i < N; i++) {
        const double* l = &logits[i * Vp];
        double mx = -INFINITY, mn = INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) { mx = fmax(mx, l[v]); mn = fmin(mn, l[v]); }
        for (int v = 0; v < V; v++) { sum += exp(l[v] - mx); }
        r.range = fmax(r.range, mx - mn);
        r.losses.v[i] = weights[i] * (mx + log(sum) - l[targets[i]]);
        // +1: the error of log(sum) is absolute (the relative error of sum)
        r.losses.mag[i] = fabs(weights[i]) * (fabs(mx) + log(sum) + 1.0 + fabs(l[targets[i]]));
        for (int v = 0; v < V; v++) {
            double p = exp(l[v] - mx) / sum, onehot = v == targets[i] ? 1.0 : 0.0;
            r.dlogits.v[i * Vp + v] = dloss * weights[i] * (p - onehot);
            r.dlogits.mag[i * Vp + v] = fabs(dloss * weights[i]) * (p + onehot);
        }
    }
    return r;
}

static void test_classifier() {
    int B = 2, T = 3, V = 10, Vp = 16, N = B * T;
    std::vector<float> logits = randn(N * Vp, 3.0f), weights(N), losses(N), losses2(N);
    std::vector<int> targets(N);
    for (int i = 0; i < N; i++) {   // 0/1 masks and signed (policy-gradient) weights
        targets[i] = (int)(rng_u32(&rng) % V);
        weights[i] = (i % 3 == 0) ? 0.0f : (i % 3 == 1) ? 1.0f + i : -0.5f - i;
    }
    for (int i = 0; i < N; i++) for (int v = V; v < Vp; v++) { logits[i * Vp + v] = 100.0f; }   // padding must be ignored
    float dloss = 0.25f;
    ClassifierRef r = ref_classifier(to_double(logits), to_double(weights), targets, dloss, N, V, Vp);
    std::vector<float> x = logits, y = logits;
    fused_classifier(x.data(), losses.data(), weights.data(), targets.data(), dloss, B, T, V, Vp, 1);
    fused_classifier(y.data(), losses2.data(), weights.data(), targets.data(), dloss, B, T, V, Vp, 0);
    // d: exp turns the rounding of logit - max (u range) into a relative error; the sum has V terms
    Tight fwd, bwd;
    fwd.add("loss", losses.data(), r.losses, V + r.range + 16);
    fwd.add("loss (no dlogits)", losses2.data(), r.losses, V + r.range + 16);
    bool untouched = memcmp(y.data(), logits.data(), logits.size() * sizeof(float)) == 0;
    fwd.detail += untouched ? ", logits untouched" : ", LOGITS WRITTEN with write_dlogits = 0";
    fwd.worst = untouched ? fwd.worst : INFINITY;
    fwd.report("fused classifier loss vs double (weights, padded vocab)");
    bwd.add("dlogits", x.data(), r.dlogits, V + r.range + 16);   // padded columns: mag 0, must be 0
    bwd.report("fused classifier dlogits vs double");
    vec l = to_double(logits);
    auto loss = [&]() { vec s = ref_classifier(l, to_double(weights), targets, 1.0, N, V, Vp).losses.v; return dot(s, vec(N, 1.0)); };
    report_fd("classifier reference (double) vs finite differences",
              fd_error(l, ref_classifier(l, to_double(weights), targets, 1.0, N, V, Vp).dlogits.v, loss));
}

// ---------------------------------------------------------------------------------------------
static void test_adamw() {
    size_t n = 1000;
    std::vector<float> p = randn(n), m(n, 0.0f), v(n, 0.0f);
    std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f;
    for (int t = 1; t <= 5; t++) {
        std::vector<float> g = randn(n);
        adamw_update(p.data(), NULL, g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t, scale, 0);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * scale;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            double mhat = md[i] / (1 - pow(b1, t)), vhat = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * pd[i]);
        }
    }
    double e = 0.0;
    for (size_t i = 0; i < n; i++) { e = fmax(e, fabs(p[i] - pd[i])); }
    char detail[64];
    snprintf(detail, sizeof(detail), "abs err after 5 steps %.1e", e);
    report("AdamW vs the formula in double", e < 1e-5, detail);
}

// Run `fn` with 1 and with 2 threads and demand bit-identical outputs.
static void test_thread_independence() {
#ifdef _OPENMP
    int B = 4, T = 16, C = 48, V = 8;
    std::vector<int> inp(B * T);
    for (auto& t : inp) { t = (int)(rng_u32(&rng) % V); }
    std::vector<float> dout = randn(B * T * C), x = randn(B * T * C), w = randn(C), b = randn(C);
    std::vector<float> out(B * T * C), mean(B * T), rstd(B * T), big = randn(100000);
    int MC = 300, MOC = 260;
    std::vector<float> minp = randn(B * T * MC), mw = randn(MOC * MC), mb = randn(MOC), mdout = randn(B * T * MOC);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), B, T, C);
    std::vector<float> results[2];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f), dx(B * T * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
        float norm;
        encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
        layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), B, T, C);
        global_norm_squared(&norm, big.data(), big.size());
        // the matmul, with more than one k block in each product (MM_KC = 256)
        std::vector<float> mout(B * T * MC), mdinp(B * T * MC), mdw(MOC * MC, 0.0f), mdb(MOC, 0.0f);
        matmul_forward(mout.data(), minp.data(), mw.data(), mb.data(), B, T, MC, MOC);
        matmul_backward(mdinp.data(), mdw.data(), mdb.data(), mdout.data(), minp.data(), mw.data(), B, T, MC, MOC);
        for (auto* t : {&dwte, &dwpe, &dx, &dw, &db, &mout, &mdinp, &mdw, &mdb}) {
            results[k].insert(results[k].end(), t->begin(), t->end());
        }
        results[k].push_back(norm);
    }
    omp_set_num_threads(saved);
    int same = memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)) == 0;
    report("encoder, layernorm, matmul, norm: 1 thread == 2 threads", same, same ? "bit-identical" : "differ");
#endif
    // the norm itself against a double sum
    std::vector<float> v = randn(50001);
    float norm_sq;
    global_norm_squared(&norm_sq, v.data(), v.size());
    double ref = 0.0;
    for (float f : v) { ref += (double)f * f; }
    char detail[64];
    snprintf(detail, sizeof(detail), "rel err %.1e", fabs(norm_sq - ref) / ref);
    report("global_norm_squared vs double sum", fabs(norm_sq - ref) / ref < 1e-6, detail);
}

int main() {
    rng_init(&rng, 1234);
    test_matmul();
    test_layernorm();
    test_gelu();
    test_attention();
    test_encoder();
    test_classifier();
    test_adamw();
    test_thread_independence();
    printf("%s\n", failures ? "kernel tests FAILED" : "kernel tests passed");
    return failures ? 1 : 0;
}
