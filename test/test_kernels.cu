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
#include "../llmc/cpu/matmul_naive.h"   // the reference the matmul is checked against
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
// score_mag: the largest sum |q_i k_i| / sqrt(hs); lse (B, NH, T): log sum_{t2 <= t} exp(S[t][t2]),
// lse_mag: the largest |lse|
struct AttentionRef { Ref out, dinp; double score_mag; vec lse; double lse_mag; };

static AttentionRef ref_attention(const vec& qkv, const vec& dout, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    double scale = 1.0 / sqrt((double)hs);
    AttentionRef r{Ref(B * T * C), Ref(B * T * C3), 0.0, vec(B * NH * T), 0.0};
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
                r.lse[(b * NH + h) * T + t] = mx + log(sum);
                r.lse_mag = fmax(r.lse_mag, fabs(mx + log(sum)));
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

// Two shapes: the small one (hs = 4: the kernels' one-column path), and hs = 44 = 16 + 16 + 8 + 4
// with T = 37 (every path of llmc/cpu/attention_kernel.h: the register blocks of 16 and 8
// columns, the single columns, row blocks cut by the diagonal and by T).
static void test_attention_case(int B, int T, int C, int NH, bool fd) {
    int hs = C / NH;
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
    char name[96];
    Tight fwd, bwd;
    fwd.add("out", out.data(), r.out, d_P + T + 16);
    snprintf(name, sizeof(name), "causal attention forward vs double (T=%d hs=%d)", T, hs);
    fwd.report(name);
    bwd.add("dqkv", dqkv.data(), r.dinp, 2 * d_P + hs + 2 * T + 16);
    snprintf(name, sizeof(name), "causal attention backward vs double (T=%d hs=%d)", T, hs);
    bwd.report(name);
    if (!fd) { return; }
    vec x = to_double(qkv), R = to_double(dout);
    auto loss = [&]() { return dot(ref_attention(x, R, B, T, C, NH).out.v, R); };
    report_fd("attention reference (double) vs finite differences", fd_error(x, ref_attention(x, R, B, T, C, NH).dinp.v, loss));
}

static void test_attention() {
    test_attention_case(2, 7, 12, 3, true);
    test_attention_case(2, 37, 88, 2, false);
}

// ---------------------------------------------------------------------------------------------
// attention by blocks (llmc/cpu/attention_block.h: the pieces of ring attention). The whole causal
// attention of a sequence, computed as a context-parallel rank does it: the query rows live in a
// local buffer in segments (a zigzag split: segment rows are not contiguous in the sequence, and
// each carries its global position), the keys come in blocks of uneven lengths (some read in place
// in q|k|v with ld 3C, some from packed [k|v] copies made with copy_rows, ld 2C), each (segment,
// block) pair is attended with attention_block_forward and merged with attention_merge from
// (o, lse) = (0, -inf); the backward takes delta from the merged o and revisits the same pairs with
// the final lse, dq accumulating in place and dk|dv in the block's home buffer, directly or
// through a zeroed partial added with add_floats (as a partial travelling the ring would).
// Checked against the double reference (ref_attention, with its lse), and against the float
// attention_forward / attention_backward (tolerance: the sum of the two kernels' bounds).
// Error bounds, in units of u, with smag = r.score_mag, L = r.lse_mag, K = the longest block,
// sigma = (hs + 2) smag (the scores' rounding, as in test_attention's d_P) and nm = blocks - 1 (a
// merge with a side at -inf is exact: weights 0 and 1). The scores' rounding is the same whichever
// block a score is in: the blocks compute exactly the attention of slightly perturbed scores, so
// sigma enters once, as in test_attention; what the blocks add is the rounding of their lse and
// of the merges:
//   lse: a block's l sums K terms, then log, exp and m + log round: K + L + 4 (absolute). A merge
//     rounds la - m (2L), exp, the sum, log (4) and m + log (L): E_ns = K + L + 4 + nm (3L + 8);
//     the lse errs by E = sigma + E_ns.
//   o: sigma + 2K + 16 in a block (P, then a sum of K terms), relative to mag = sum P |v|. A merge
//     is a weighted average whose normalised weights err by 2 E_ns + 4L + 12 relatively, and the
//     merged mag is the same average of the parts' mags: d_out = sigma + 2K + 16 + nm (2 E_ns + 4L + 12).
//   backward: P = exp(s - lse) errs relatively by d_Pb = 2 (sigma + L) + E_ns + 4 (the score in s and
//     in lse, the rounding of s - lse); delta = dout . o by hs + d_out relative to sum |dout| sum P|v|
//     = the reference's row sum magnitude; dS has both and dP (hs); dq and dk sum T of them in nb
//     partial sums onto their start, dv has no dS:
//     d_dqk = d_Pb + d_out + 2 hs + T + nb + 20,  d_dv = d_Pb + T + nb + 20.
struct Span { int start, len; };

static void test_attention_block_case(int B, int T, int C, int NH, const std::vector<Span>& segs,
                                      const std::vector<Span>& blocks) {
    int hs = C / NH, C3 = 3 * C, C2 = 2 * C, nb = (int)blocks.size(), nseg = (int)segs.size();
    std::vector<float> qkv = randn(B * T * C3), dout = randn(B * T * C);
    std::vector<float> dq0 = randn(B * T * C), dkv0 = randn(B * T * C2);   // gradients ACCUMULATE onto these
    AttentionRef r = ref_attention(to_double(qkv), to_double(dout), B, T, C, NH);
    std::vector<int> seg_off(nseg);   // each segment's first row in the local buffers
    int Tl = 0;
    for (int s = 0; s < nseg; s++) { seg_off[s] = Tl; Tl += segs[s].len; }

    struct Result { std::vector<float> o, lse, dq, dkv; int masked_rows = 0, masked_bad = 0; };
    auto run = [&]() {
        Result res;
        // the rank's local rows: q|k|v and dout of its segments, side by side
        std::vector<float> qkv_l(B * Tl * C3), dout_l(B * Tl * C), o_l(B * Tl * C), lse_l(B * NH * Tl), dq_l(B * Tl * C);
        for (int s = 0; s < nseg; s++) {
            int a = segs[s].start, n = segs[s].len, off = seg_off[s];
            copy_rows(qkv_l.data() + off * C3, Tl, C3, qkv.data() + a * C3, T, C3, B, n, C3);
            copy_rows(dout_l.data() + off * C, Tl, C, dout.data() + a * C, T, C, B, n, C);
            copy_rows(dq_l.data() + off * C, Tl, C, dq0.data() + a * C, T, C, B, n, C);
        }
        fill_floats(o_l.data(), 0.0f, o_l.size());
        fill_floats(lse_l.data(), -INFINITY, lse_l.size());
        // the key blocks: packed [k|v] copies (even blocks) and the home of their dk|dv
        std::vector<std::vector<float>> kv(nb), dkv(nb);
        for (int k = 0; k < nb; k++) {
            int a = blocks[k].start, n = blocks[k].len;
            kv[k].resize(B * n * C2);
            dkv[k].resize(B * n * C2);
            copy_rows(kv[k].data(), n, C2, qkv.data() + a * C3 + C, T, C3, B, n, C2);
            copy_rows(dkv[k].data(), n, C2, dkv0.data() + a * C2, T, C2, B, n, C2);
        }
        auto key_rows = [&](int k, const float** kp, int* seq, int* ld) {
            if (k % 2 == 0) { *kp = kv[k].data(); *seq = blocks[k].len; *ld = C2; }
            else { *kp = qkv.data() + blocks[k].start * C3 + C; *seq = T; *ld = C3; }
        };
        for (int s = 0; s < nseg; s++) {
            int nq = segs[s].len, off = seg_off[s];
            for (int step = 0; step < nb; step++) {   // the blocks in ring order, from a different one per segment
                int k = (s + step) % nb, nk = blocks[k].len, kv_seq, kv_ld;
                const float* kp;
                key_rows(k, &kp, &kv_seq, &kv_ld);
                std::vector<float> o(B * nq * C, NAN), lse(B * NH * nq, NAN);
                attention_block_forward(o.data(), lse.data(), qkv_l.data() + off * C3, Tl, C3, kp, kp + C, kv_seq, kv_ld,
                                        B, nq, nk, C, NH, segs[s].start, blocks[k].start);
                for (int b = 0; b < B; b++) {   // a row that sees none of the block: exactly lse -inf, o 0
                    for (int i = 0; i < nq; i++) {
                        if (blocks[k].start <= segs[s].start + i) { continue; }
                        for (int h = 0; h < NH; h++) {
                            res.masked_rows++;
                            bool ok = lse[(b * NH + h) * nq + i] == -INFINITY;
                            for (int c = 0; c < hs; c++) { ok = ok && o[(b * nq + i) * C + h * hs + c] == 0.0f; }
                            res.masked_bad += !ok;
                        }
                    }
                }
                attention_merge(o_l.data() + off * C, lse_l.data() + off, Tl, o.data(), lse.data(), B, nq, C, NH);
            }
        }
        std::vector<float> delta(B * NH * Tl, NAN);
        attention_block_delta(delta.data(), dout_l.data(), o_l.data(), B, Tl, C, NH);
        for (int s = 0; s < nseg; s++) {
            int nq = segs[s].len, off = seg_off[s];
            for (int step = 0; step < nb; step++) {
                int k = (s + step) % nb, nk = blocks[k].len, kv_seq, kv_ld;
                const float* kp;
                key_rows(k, &kp, &kv_seq, &kv_ld);
                std::vector<float> part;
                float* dk = dkv[k].data();
                if (k % 2 == 0) {   // into a zeroed partial, then added home
                    part.resize(B * nk * C2);
                    fill_floats(part.data(), 0.0f, part.size());
                    dk = part.data();
                }
                attention_block_backward(dq_l.data() + off * C, Tl, dk, dk + C, nk, C2, dout_l.data() + off * C, Tl,
                                         lse_l.data() + off, delta.data() + off, Tl, qkv_l.data() + off * C3, Tl, C3,
                                         kp, kp + C, kv_seq, kv_ld, B, nq, nk, C, NH, segs[s].start, blocks[k].start);
                if (k % 2 == 0) { add_floats(dkv[k].data(), part.data(), part.size()); }
            }
        }
        // back to the sequence's order
        res.o.resize(B * T * C); res.lse.resize(B * NH * T); res.dq.resize(B * T * C); res.dkv.resize(B * T * C2);
        for (int s = 0; s < nseg; s++) {
            int a = segs[s].start, n = segs[s].len, off = seg_off[s];
            copy_rows(res.o.data() + a * C, T, C, o_l.data() + off * C, Tl, C, B, n, C);
            copy_rows(res.dq.data() + a * C, T, C, dq_l.data() + off * C, Tl, C, B, n, C);
            copy_rows(res.lse.data() + a, T, 1, lse_l.data() + off, Tl, 1, B * NH, 1, n);   // (b, h) rows of n floats
        }
        for (int k = 0; k < nb; k++) {
            copy_rows(res.dkv.data() + blocks[k].start * C2, T, C2, dkv[k].data(), blocks[k].len, C2, B, blocks[k].len, C2);
        }
        return res;
    };
    Result res = run();

    // the reference: out, lse; dq, dk, dv = start + the reference's gradient
    Ref lse_ref(B * NH * T), dq_ref(dq0), dk_ref(B * T * C), dv_ref(B * T * C);
    for (size_t i = 0; i < lse_ref.v.size(); i++) { lse_ref.v[i] = r.lse[i]; lse_ref.mag[i] = 1.0; }   // absolute
    for (int bt = 0; bt < B * T; bt++) {
        for (int c = 0; c < C; c++) {
            dq_ref.v[bt * C + c] += r.dinp.v[bt * C3 + c];
            dq_ref.mag[bt * C + c] += r.dinp.mag[bt * C3 + c];
            dk_ref.v[bt * C + c] = dkv0[bt * C2 + c] + r.dinp.v[bt * C3 + C + c];
            dk_ref.mag[bt * C + c] = fabs(dkv0[bt * C2 + c]) + r.dinp.mag[bt * C3 + C + c];
            dv_ref.v[bt * C + c] = dkv0[bt * C2 + C + c] + r.dinp.v[bt * C3 + 2 * C + c];
            dv_ref.mag[bt * C + c] = fabs(dkv0[bt * C2 + C + c]) + r.dinp.mag[bt * C3 + 2 * C + c];
        }
    }
    std::vector<float> dk(B * T * C), dv(B * T * C);
    for (int bt = 0; bt < B * T; bt++) {
        for (int c = 0; c < C; c++) { dk[bt * C + c] = res.dkv[bt * C2 + c]; dv[bt * C + c] = res.dkv[bt * C2 + C + c]; }
    }
    double L = r.lse_mag, nm = nb - 1, sigma = (hs + 2) * r.score_mag, K = 0;
    for (const Span& k : blocks) { K = fmax(K, k.len); }
    double E_ns = K + L + 4 + nm * (3 * L + 8), E = sigma + E_ns;
    double d_out = sigma + 2 * K + 16 + nm * (2 * E_ns + 4 * L + 12);
    double d_Pb = 2 * (sigma + L) + E_ns + 4;
    double d_dqk = d_Pb + d_out + 2 * hs + T + nb + 20, d_dv = d_Pb + T + nb + 20;
    double d_P = sigma + T;   // test_attention's, for the float kernels of the whole sequence
    char name[128], what[64];
    snprintf(what, sizeof(what), "T=%d, %d seg x %d blocks", T, nseg, nb);
    Tight fwd, bwd;
    fwd.add("out", res.o.data(), r.out, d_out);
    fwd.add("lse (abs)", res.lse.data(), lse_ref, E);
    snprintf(name, sizeof(name), "attention by blocks: fwd + merge vs double, %s", what);
    fwd.report(name);
    bwd.add("dq", res.dq.data(), dq_ref, d_dqk);
    bwd.add("dk", dk.data(), dk_ref, d_dqk);
    bwd.add("dv", dv.data(), dv_ref, d_dv);
    snprintf(name, sizeof(name), "attention by blocks: bwd vs double (accumulates), %s", what);
    bwd.report(name);
    char detail[96];
    snprintf(detail, sizeof(detail), "%d (b, h, row) x block unseen, %d not lse -inf, o 0", res.masked_rows, res.masked_bad);
    snprintf(name, sizeof(name), "attention by blocks: rows seeing no key, %s", what);
    report(name, res.masked_bad == 0, detail);

    // against the float kernels of the whole sequence: |blocks - float| <= both bounds
    std::vector<float> out(B * T * C), att(attention_state_size(B, T, NH)), dinp(B * T * C3);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(dinp.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    Ref fo(B * T * C), fq(B * T * C), fk(B * T * C), fv(B * T * C);
    for (int bt = 0; bt < B * T; bt++) {
        for (int c = 0; c < C; c++) {
            int i = bt * C + c;
            fo.v[i] = out[i]; fo.mag[i] = r.out.mag[i];
            fq.v[i] = dq0[i] + dinp[bt * C3 + c]; fq.mag[i] = dq_ref.mag[i];
            fk.v[i] = dkv0[bt * C2 + c] + dinp[bt * C3 + C + c]; fk.mag[i] = dk_ref.mag[i];
            fv.v[i] = dkv0[bt * C2 + C + c] + dinp[bt * C3 + 2 * C + c]; fv.mag[i] = dv_ref.mag[i];
        }
    }
    Tight vs;   // test_attention's bounds of the float kernels: d_P + T + 16, 2 d_P + hs + 2 T + 16 (+1: the start)
    vs.add("out", res.o.data(), fo, d_out + d_P + T + 16);
    vs.add("dq", res.dq.data(), fq, d_dqk + 2 * d_P + hs + 2 * T + 17);
    vs.add("dk", dk.data(), fk, d_dqk + 2 * d_P + hs + 2 * T + 17);
    vs.add("dv", dv.data(), fv, d_dv + 2 * d_P + hs + 2 * T + 17);
    snprintf(name, sizeof(name), "attention by blocks vs attention_fwd/bwd (float), %s", what);
    vs.report(name);
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    Result r1 = run();
    omp_set_num_threads(2);
    Result r2 = run();
    omp_set_num_threads(saved);
    bool same = r1.o == r2.o && r1.dq == r2.dq && r1.dkv == r2.dkv &&
                memcmp(r1.lse.data(), r2.lse.data(), r1.lse.size() * sizeof(float)) == 0;
    snprintf(name, sizeof(name), "attention by blocks: 1 thread == 2 threads, %s", what);
    report(name, same, same ? "bit-identical" : "differ");
#endif
}

// copy_rows, store_rows (on the CPU a copy too), add_floats, fill_floats: exact
static void test_block_rows() {
    int B = 2, sseq = 5, sld = 7, dseq = 4, dld = 6, rows = 3, width = 5;
    std::vector<float> src = randn(B * sseq * sld), dst(B * dseq * dld, 42.0f), dst2 = dst;
    copy_rows(dst.data(), dseq, dld, src.data(), sseq, sld, B, rows, width);
    store_rows(dst2.data(), dseq, dld, src.data(), sseq, sld, B, rows, width);
    int bad = 0;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < dseq; i++) {
            for (int c = 0; c < dld; c++) {
                float want = i < rows && c < width ? src[(b * sseq + i) * sld + c] : 42.0f;   // the rest untouched
                bad += dst[(b * dseq + i) * dld + c] != want;
                bad += dst2[(b * dseq + i) * dld + c] != want;
            }
        }
    }
    size_t n = 1001;
    std::vector<float> a = randn(n), x = randn(n), sum = a, f(n + 1, 7.0f);
    add_floats(sum.data(), x.data(), n);
    for (size_t i = 0; i < n; i++) { bad += sum[i] != a[i] + x[i]; }
    fill_floats(f.data(), -INFINITY, n);
    for (size_t i = 0; i < n; i++) { bad += f[i] != -INFINITY; }
    bad += f[n] != 7.0f;   // one past the end untouched
    char detail[64];
    snprintf(detail, sizeof(detail), "%d elements wrong", bad);
    report("copy_rows, store_rows, add_floats, fill_floats exact", bad == 0, detail);
}

static void test_attention_block() {
    // a zigzag split of T = 37 over 2 ranks (chunks 0 and 3 for rank 0, 1 and 2 for rank 1), key blocks of 8, 15, 14
    test_attention_block_case(2, 37, 24, 3, {{0, 10}, {27, 10}, {10, 17}}, {{0, 8}, {8, 15}, {23, 14}});
    test_attention_block_case(2, 1, 24, 3, {{0, 1}}, {{0, 1}});
    test_block_rows();
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
// mixture of experts (llmc/cpu/moe.h): N = B*T token rows, E experts, k assignments per token.
//   softmax: p = exp(z - m) / sum exp(z - m)
//   router backward: dp[e_j] = dgate_j (k = 1) or (dgate_j - sum_i g_i dgate_i) / S (k >= 2,
//     g_i = p[e_i] / S, S = sum_i p[e_i]); dp[e] += aux[t / T][e]; dz = p (dp - sum_e p dp)
//   combine: out = (old) + sum_{kept j} w_j y[slot_j];  backward: dy[slot_j] = w_j dout, dw_j = dout . y[slot_j]
// The routing of a test: k distinct random experts per token, about drop_pct % of the assignments
// dropped (slot -1), the kept ones sent to distinct random rows of y, which has 3 rows no slot names.
struct MoeRouting { std::vector<int> idx, slot; int ny, dropped; };

static MoeRouting moe_routing(int N, int E, int k, int drop_pct) {
    MoeRouting r;
    r.idx.resize((size_t)N * k);
    r.slot.resize((size_t)N * k);
    std::vector<int> perm(E);
    for (int t = 0; t < N; t++) {   // k distinct experts: a partial Fisher-Yates shuffle
        for (int e = 0; e < E; e++) { perm[e] = e; }
        for (int j = 0; j < k; j++) {
            int i = j + (int)(rng_u32(&rng) % (uint32_t)(E - j));
            std::swap(perm[j], perm[i]);
            r.idx[(size_t)t * k + j] = perm[j];
        }
    }
    int kept = 0;
    for (auto& s : r.slot) { s = (int)(rng_u32(&rng) % 100) < drop_pct ? -1 : kept++; }
    r.dropped = N * k - kept;
    r.ny = kept + 3;
    std::vector<int> rows(r.ny);
    for (int i = 0; i < r.ny; i++) { rows[i] = i; }
    for (int i = r.ny - 1; i > 0; i--) { std::swap(rows[i], rows[rng_u32(&rng) % (uint32_t)(i + 1)]); }
    for (auto& s : r.slot) { if (s >= 0) { s = rows[s]; } }
    return r;
}

// p with mag = p (1 + max_e |z - m|): z - m errs by u |z - m|, which exp makes relative
static Ref ref_moe_softmax(const vec& z, int N, int E) {
    Ref r((size_t)N * E);
    for (int t = 0; t < N; t++) {
        double m = -INFINITY, s = 0.0, range = 0.0;
        for (int e = 0; e < E; e++) { m = fmax(m, z[(size_t)t * E + e]); }
        for (int e = 0; e < E; e++) { s += exp(z[(size_t)t * E + e] - m); range = fmax(range, m - z[(size_t)t * E + e]); }
        for (int e = 0; e < E; e++) {
            double p = exp(z[(size_t)t * E + e] - m) / s;
            r.v[(size_t)t * E + e] = p;
            r.mag[(size_t)t * E + e] = p * (1.0 + range);
        }
    }
    return r;
}

// the forward the router backward differentiates (check 1): sum_t,j dgate g_j + sum_t,e aux p
static double ref_moe_router_loss(const vec& z, const std::vector<int>& idx, const vec& dgate, const vec& aux, int N,
                                  int E, int k, int T) {
    Ref p = ref_moe_softmax(z, N, E);
    double L = 0.0;
    for (int t = 0; t < N; t++) {
        const double* pt = &p.v[(size_t)t * E];
        double S = 0.0;
        for (int j = 0; j < k; j++) { S += pt[idx[(size_t)t * k + j]]; }
        for (int j = 0; j < k; j++) {
            double g = pt[idx[(size_t)t * k + j]];
            L += dgate[(size_t)t * k + j] * (k == 1 ? g : g / S);
        }
        for (int e = 0; e < E && !aux.empty(); e++) { L += aux[(size_t)(t / T) * E + e] * pt[e]; }
    }
    return L;
}

// dz with its magnitude chain: |coef_j| <= (|dgate_j| + sum_i g_i |dgate_i|) / S, |dp| <= that + |aux|,
// |dot| <= sum p |dp|, |dz| <= p (|dp| + |dot|)
static Ref ref_moe_router_backward(const vec& p, const std::vector<int>& idx, const vec& dgate, const vec& aux, int N,
                                   int E, int k, int T) {
    Ref r((size_t)N * E);
    vec dp(E), mdp(E);
    for (int t = 0; t < N; t++) {
        const double* pt = &p[(size_t)t * E];
        const int* ix = &idx[(size_t)t * k];
        const double* dg = &dgate[(size_t)t * k];
        for (int e = 0; e < E; e++) { dp[e] = 0.0; mdp[e] = 0.0; }
        if (k == 1) {
            dp[ix[0]] += dg[0];
            mdp[ix[0]] += fabs(dg[0]);
        } else {
            double S = 0.0, G = 0.0, mG = 0.0;
            for (int j = 0; j < k; j++) { S += pt[ix[j]]; }
            for (int j = 0; j < k; j++) { G += pt[ix[j]] / S * dg[j]; mG += pt[ix[j]] / S * fabs(dg[j]); }
            for (int j = 0; j < k; j++) { dp[ix[j]] += (dg[j] - G) / S; mdp[ix[j]] += (fabs(dg[j]) + mG) / S; }
        }
        for (int e = 0; e < E && !aux.empty(); e++) {
            dp[e] += aux[(size_t)(t / T) * E + e];
            mdp[e] += fabs(aux[(size_t)(t / T) * E + e]);
        }
        double dot = 0.0, mdot = 0.0;
        for (int e = 0; e < E; e++) { dot += pt[e] * dp[e]; mdot += pt[e] * mdp[e]; }
        for (int e = 0; e < E; e++) {
            r.v[(size_t)t * E + e] = pt[e] * (dp[e] - dot);
            r.mag[(size_t)t * E + e] = pt[e] * (mdp[e] + mdot);
        }
    }
    return r;
}

// out = (accumulate ? start : 0) + sum_{kept j} w_j y[slot_j] (w empty: 1)
static Ref ref_moe_combine(const std::vector<float>& start, const vec& y, const std::vector<int>& slot, const vec& w,
                           int N, int k, int C, int accumulate) {
    Ref r = accumulate ? Ref(start) : Ref((size_t)N * C);
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < k; j++) {
            int s = slot[(size_t)t * k + j];
            if (s < 0) { continue; }
            double wj = w.empty() ? 1.0 : w[(size_t)t * k + j];
            for (int c = 0; c < C; c++) {
                r.v[(size_t)t * C + c] += wj * y[(size_t)s * C + c];
                r.mag[(size_t)t * C + c] += fabs(wj * y[(size_t)s * C + c]);
            }
        }
    }
    return r;
}

// dy starts as dy0 (rows no slot names keep it, exactly); dw (N, k)
struct MoeCombineRef { Ref dy, dw; };
static MoeCombineRef ref_moe_combine_backward(const std::vector<float>& dy0, const vec& dout, const vec& y,
                                              const std::vector<int>& slot, const vec& w, int N, int k, int C) {
    MoeCombineRef r{Ref(dy0), Ref((size_t)N * k)};
    for (int i = 0; i < N * k; i++) {
        int s = slot[i], t = i / k;
        if (s < 0) { continue; }   // dw = 0 exactly
        for (int c = 0; c < C; c++) {
            double d = dout[(size_t)t * C + c];
            r.dy.v[(size_t)s * C + c] = w[i] * d;
            r.dy.mag[(size_t)s * C + c] = fabs(w[i] * d);
            r.dw.v[i] += d * y[(size_t)s * C + c];
            r.dw.mag[i] += fabs(d * y[(size_t)s * C + c]);
        }
    }
    return r;
}

static void test_moe_case(int B, int T, int E, int k, int C, int drop_pct, bool with_aux) {
    int N = B * T;
    MoeRouting rt = moe_routing(N, E, k, drop_pct);
    char name[256], sh[96];
    snprintf(sh, sizeof(sh), "N=%d T=%d E=%d k=%d C=%d dropped=%d", N, T, E, k, C, rt.dropped);

    // softmax (logits spread wide enough that the max matters)
    std::vector<float> z = randn((size_t)N * E, 3.0f), p((size_t)N * E);
    moe_softmax(p.data(), z.data(), N, E);
    {
        Tight t;
        t.add("p", p.data(), ref_moe_softmax(to_double(z), N, E), E + 16);   // the sum of E terms, exp, the divide
        snprintf(name, sizeof(name), "moe_softmax vs double, N=%d E=%d", N, E);
        t.report(name);
    }

    // router backward on the kernel's p (an input here, as in the model)
    std::vector<float> dgate = randn((size_t)N * k), aux = with_aux ? randn((size_t)B * E, 0.3f) : std::vector<float>();
    std::vector<float> dz((size_t)N * E, NAN);
    moe_router_backward(dz.data(), p.data(), rt.idx.data(), dgate.data(), with_aux ? aux.data() : NULL, N, E, k, T);
    {
        Tight t;   // S and G (k terms each), the coefficient's quotient, the dot (E terms), a few products
        t.add("dlogits", dz.data(), ref_moe_router_backward(to_double(p), rt.idx, to_double(dgate), to_double(aux), N, E,
                                                            k, T), 2 * k + E + 16);
        snprintf(name, sizeof(name), "moe_router_backward vs double, aux=%d %s", (int)with_aux, sh);
        t.report(name);
    }

    // combine: with weights, overwriting; without weights (w NULL), accumulating
    std::vector<float> y = randn((size_t)rt.ny * C), w = std::vector<float>((size_t)N * k);
    for (auto& x : w) { x = rng_uniform(&rng); }
    for (int acc = 0; acc <= 1; acc++) {
        std::vector<float> start = randn((size_t)N * C), out = start;
        const float* wp = acc ? NULL : w.data();
        moe_combine(out.data(), y.data(), rt.slot.data(), wp, N, k, C, acc);
        Tight t;
        t.add("out", out.data(), ref_moe_combine(start, to_double(y), rt.slot, acc ? vec() : to_double(w), N, k, C, acc),
              k + 1 + 16);
        snprintf(name, sizeof(name), "moe_combine vs double, w=%s accumulate=%d %s", acc ? "NULL" : "yes", acc, sh);
        t.report(name);
    }

    // combine backward: dy overwritten where a slot names it, untouched elsewhere; then in place (dy = y)
    std::vector<float> dout = randn((size_t)N * C), dy0 = randn((size_t)rt.ny * C);
    MoeCombineRef r = ref_moe_combine_backward(dy0, to_double(dout), to_double(y), rt.slot, to_double(w), N, k, C);
    for (int inplace = 0; inplace <= 1; inplace++) {
        std::vector<float> dy = inplace ? y : dy0, dw((size_t)N * k, NAN);
        MoeCombineRef ri = inplace ? ref_moe_combine_backward(y, to_double(dout), to_double(y), rt.slot, to_double(w), N,
                                                              k, C) : r;
        moe_combine_backward(dy.data(), dw.data(), dout.data(), inplace ? dy.data() : y.data(), rt.slot.data(), w.data(),
                             N, k, C);
        Tight t;
        t.add("dy", dy.data(), ri.dy, 16);       // one product
        t.add("dw", dw.data(), ri.dw, C + 16);   // a sum of C products
        snprintf(name, sizeof(name), "moe_combine_backward vs double%s, %s", inplace ? " (in place, dy = y)" : "", sh);
        t.report(name);
    }

    // check 1: the router's reference backward against finite differences of its forward (small rows)
    {
        int Nf = T < 4 ? N : 2 * T;   // two groups when there are, so the aux term's group index matters
        if (Nf > N) { Nf = N; }
        vec zd = to_double(std::vector<float>(z.begin(), z.begin() + (size_t)Nf * E));
        std::vector<int> idx(rt.idx.begin(), rt.idx.begin() + (size_t)Nf * k);
        vec dg = to_double(std::vector<float>(dgate.begin(), dgate.begin() + (size_t)Nf * k)), ad = to_double(aux);
        Ref pd = ref_moe_softmax(zd, Nf, E);
        Ref g = ref_moe_router_backward(pd.v, idx, dg, ad, Nf, E, k, T);
        auto loss = [&]() { return ref_moe_router_loss(zd, idx, dg, ad, Nf, E, k, T); };
        snprintf(name, sizeof(name), "moe router reference vs finite differences, aux=%d E=%d k=%d", (int)with_aux, E, k);
        report_fd(name, fd_error(zd, g.v, loss));
    }
}

// gather and scale: a copy must be exact, a scale one rounding
static void test_moe_rows() {
    int n = 23, C = 37, nsrc = 11;
    std::vector<float> src = randn((size_t)nsrc * C), dst((size_t)n * C + 1, 42.0f);
    std::vector<int> idx(n);
    for (auto& i : idx) { i = (int)(rng_u32(&rng) % (uint32_t)nsrc); }
    idx[0] = nsrc - 1;
    moe_gather_rows(dst.data(), src.data(), idx.data(), n, C);
    int bad = dst[(size_t)n * C] != 42.0f;   // one past the end untouched
    for (int i = 0; i < n; i++) { bad += memcmp(&dst[(size_t)i * C], &src[(size_t)idx[i] * C], C * sizeof(float)) != 0; }
    char detail[64];
    snprintf(detail, sizeof(detail), "%d rows wrong", bad);
    report("moe_gather_rows exact, n=23 C=37", bad == 0, detail);
    moe_gather_rows(dst.data(), src.data(), idx.data(), 0, C);   // n = 0: nothing

    size_t m = 1001;
    std::vector<float> x = randn(m), x0 = x;
    x.push_back(42.0f);
    float s = 0.7f;
    moe_scale(x.data(), m, s);
    Ref rs(m);
    for (size_t i = 0; i < m; i++) { rs.v[i] = (double)x0[i] * s; rs.mag[i] = fabs(rs.v[i]); }
    Tight t;
    t.add("x", x.data(), rs, 1);   // |err| <= u |x s|: the correctly rounded product
    t.detail += x[m] == 42.0f ? ", one past the end untouched" : ", ONE PAST THE END WRITTEN";
    if (x[m] != 42.0f) { t.worst = INFINITY; }
    t.report("moe_scale vs double, n=1001");
}

static void test_moe() {
    test_moe_case(3, 13, 5, 1, 33, 25, true);    // Switch (k = 1)
    test_moe_case(3, 13, 5, 2, 33, 25, false);   // renormalised gates, no aux
    test_moe_case(3, 13, 5, 3, 33, 25, true);
    test_moe_case(2, 9, 1, 1, 7, 0, true);       // one expert: dlogits = 0
    test_moe_case(1, 20, 64, 2, 17, 40, true);
    test_moe_case(2, 5, 9, 8, 3, 30, true);      // k = 8
    test_moe_rows();
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
    std::vector<float> ax = randn(B * T * 3 * C);
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
        // attention (hs = 16, T not a multiple of its blocks)
        std::vector<float> aout(B * T * C), att(attention_state_size(B, T, 3)), adinp(B * T * 3 * C);
        attention_forward(aout.data(), att.data(), ax.data(), B, T, C, 3);
        attention_backward(adinp.data(), dout.data(), ax.data(), att.data(), B, T, C, 3);
        for (auto* t : {&dwte, &dwpe, &dx, &dw, &db, &mout, &mdinp, &mdw, &mdb, &aout, &att, &adinp}) {
            results[k].insert(results[k].end(), t->begin(), t->end());
        }
        results[k].push_back(norm);
    }
    omp_set_num_threads(saved);
    int same = memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)) == 0;
    report("encoder, layernorm, matmul, attention, norm: 1 thread == 2 threads", same, same ? "bit-identical" : "differ");
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
    test_attention_block();
    test_encoder();
    test_classifier();
    test_moe();
    test_adamw();
    test_thread_independence();
    printf("%s\n", failures ? "kernel tests FAILED" : "kernel tests passed");
    return failures ? 1 : 0;
}
