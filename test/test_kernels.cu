// Unit tests of the CPU kernels, each against an independent check:
//   - backward passes against central finite differences of the forward pass
//     (loss = sum(out * R) for a fixed random R, so dout = R);
//   - the blocked matmul against the naive triple loop, on awkward sizes;
//   - fused classifier, AdamW and the global norm against double-precision formulas;
//   - the kernels that reduce over rows (encoder, layernorm, norm) give bit-identical
//     results with 1 and 2 threads.
// Prints PASS/FAIL per check; exits 1 if any failed.
#include <vector>
#include <functional>
#include "../llmc/common.h"
#include "../llmc/backend.h"
#include "../llmc/rand.h"

static int failures = 0;
static Rng rng;

static void report(const char* name, int ok, const char* detail) {
    printf("%s %-58s %s\n", ok ? "PASS" : "FAIL", name, detail);
    if (!ok) { failures++; }
}

static std::vector<float> randn(size_t n, float std = 1.0f) {
    std::vector<float> v(n);
    rng_normal(&rng, v.data(), n, 0.0f, std);
    return v;
}

static double dot(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++) { s += (double)a[i] * b[i]; }
    return s;
}

// max |a - b| / max |b|
static double rel_err(const float* a, const float* b, size_t n) {
    double m = 0.0, e = 0.0;
    for (size_t i = 0; i < n; i++) { e = fmax(e, fabs((double)a[i] - b[i])); m = fmax(m, fabs((double)b[i])); }
    return m > 0 ? e / m : e;
}

// Compare an analytic gradient with central differences of loss(x) at up to 64 entries of x.
static double finite_difference_error(std::vector<float>& x, const std::vector<float>& grad,
                                      const std::function<double()>& loss, float h) {
    double max_grad = 1e-12, max_err = 0.0;
    for (float g : grad) { max_grad = fmax(max_grad, fabs(g)); }
    size_t n = x.size(), checks = n < 64 ? n : 64;
    for (size_t k = 0; k < checks; k++) {
        size_t i = n <= 64 ? k : rng_u32(&rng) % n;
        float saved = x[i];
        x[i] = saved + h; double lp = loss();
        x[i] = saved - h; double lm = loss();
        x[i] = saved;
        double fd = (lp - lm) / (2.0 * h);
        max_err = fmax(max_err, fabs(fd - grad[i]));
    }
    return max_err / max_grad;
}

static void test_matmul() {
    int shapes[][4] = {{1, 1, 1, 1}, {1, 3, 5, 7}, {2, 17, 33, 65}, {1, 100, 129, 257}, {4, 64, 768, 96}};
    for (auto& s : shapes) {
        int B = s[0], T = s[1], C = s[2], OC = s[3];
        size_t BT = (size_t)B * T;
        for (int with_bias = 0; with_bias <= 1; with_bias++) {
            std::vector<float> inp = randn(BT * C), w = randn((size_t)OC * C), bias = randn(OC), dout = randn(BT * OC);
            std::vector<float> out(BT * OC), out_ref(BT * OC);
            const float* b = with_bias ? bias.data() : NULL;
            matmul_forward(out.data(), inp.data(), w.data(), b, B, T, C, OC);
            matmul_forward_naive(out_ref.data(), inp.data(), w.data(), b, B, T, C, OC);
            // the gradients start non-zero: dweight and dbias must ACCUMULATE, dinp must OVERWRITE
            std::vector<float> dinp = randn(BT * C), dw = randn((size_t)OC * C), db = randn(OC);
            std::vector<float> dinp_ref = randn(BT * C), dw_ref = dw, db_ref = db;
            matmul_backward(dinp.data(), dw.data(), with_bias ? db.data() : NULL, dout.data(), inp.data(), w.data(), B, T, C, OC);
            matmul_backward_naive(dinp_ref.data(), dw_ref.data(), with_bias ? db_ref.data() : NULL, dout.data(), inp.data(),
                                  w.data(), B, T, C, OC);
            double e = fmax(rel_err(out.data(), out_ref.data(), out.size()), rel_err(dinp.data(), dinp_ref.data(), dinp.size()));
            e = fmax(e, rel_err(dw.data(), dw_ref.data(), dw.size()));
            if (with_bias) { e = fmax(e, rel_err(db.data(), db_ref.data(), db.size())); }
            char name[96], detail[64];
            snprintf(name, sizeof(name), "matmul vs naive, BT=%zu C=%d OC=%d bias=%d", BT, C, OC, with_bias);
            snprintf(detail, sizeof(detail), "rel err %.2e", e);
            report(name, e < 1e-5, detail);
        }
    }
    // and the naive one against finite differences, so the pair is anchored to the math
    int B = 2, T = 3, C = 5, OC = 4;
    std::vector<float> inp = randn(B * T * C), w = randn(OC * C), bias = randn(OC), R = randn(B * T * OC), out(B * T * OC);
    auto loss = [&]() { matmul_forward_naive(out.data(), inp.data(), w.data(), bias.data(), B, T, C, OC); return dot(out, R); };
    std::vector<float> dinp(B * T * C), dw(OC * C, 0.0f), db(OC, 0.0f);
    matmul_backward_naive(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), B, T, C, OC);
    double e = fmax(finite_difference_error(inp, dinp, loss, 1e-2f), finite_difference_error(w, dw, loss, 1e-2f));
    e = fmax(e, finite_difference_error(bias, db, loss, 1e-2f));
    char detail[64];
    snprintf(detail, sizeof(detail), "rel err %.2e", e);
    report("matmul_backward_naive vs finite differences", e < 1e-2, detail);
}

static void test_layernorm() {
    int B = 2, T = 3, C = 40;
    std::vector<float> x = randn(B * T * C, 2.0f), w = randn(C), b = randn(C), R = randn(B * T * C);
    std::vector<float> out(B * T * C), mean(B * T), rstd(B * T);
    auto loss = [&]() { layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), B, T, C); return dot(out, R); };
    loss();
    std::vector<float> dx(B * T * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), B, T, C);
    double e = finite_difference_error(x, dx, loss, 1e-2f);
    e = fmax(e, finite_difference_error(w, dw, loss, 1e-2f));
    e = fmax(e, finite_difference_error(b, db, loss, 1e-2f));
    // the forward against a double-precision evaluation (loss() last ran at a perturbed x)
    loss();
    double worst = 0.0;
    for (int i = 0; i < B * T; i++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) { m += x[i * C + c]; }
        m /= C;
        for (int c = 0; c < C; c++) { v += (x[i * C + c] - m) * (x[i * C + c] - m); }
        double s = 1.0 / sqrt(v / C + 1e-5);
        for (int c = 0; c < C; c++) { worst = fmax(worst, fabs(out[i * C + c] - ((x[i * C + c] - m) * s * w[c] + b[c]))); }
    }
    char detail[96];
    snprintf(detail, sizeof(detail), "forward abs err %.1e, fd rel err %.2e", worst, e);
    report("layernorm forward/backward vs finite differences", e < 1e-2 && worst < 1e-5, detail);
}

static void test_gelu() {
    size_t N = 200;
    std::vector<float> x = randn(N, 2.0f), R = randn(N), out(N), dx(N);
    auto loss = [&]() { gelu_forward(out.data(), x.data(), N); return dot(out, R); };
    loss();
    double fwd = 0.0;
    for (size_t i = 0; i < N; i++) {
        double xi = x[i], ref = 0.5 * xi * (1.0 + tanh(sqrt(2.0 / M_PI) * (xi + 0.044715 * xi * xi * xi)));
        fwd = fmax(fwd, fabs(ref - out[i]));
    }
    gelu_backward(dx.data(), x.data(), R.data(), N);
    double e = finite_difference_error(x, dx, loss, 1e-2f);
    char detail[96];
    snprintf(detail, sizeof(detail), "forward abs err %.1e, fd rel err %.2e", fwd, e);
    report("gelu (tanh) forward and backward", fwd < 1e-5 && e < 1e-2, detail);
}

static void test_attention() {
    int B = 2, T = 7, C = 12, NH = 3, hs = C / NH;
    std::vector<float> qkv = randn(B * T * 3 * C), R = randn(B * T * C), out(B * T * C), att(attention_state_size(B, T, NH));
    auto loss = [&]() { attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH); return dot(out, R); };
    loss();
    // forward against a direct double-precision evaluation
    double fwd = 0.0;
    for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) for (int h = 0; h < NH; h++) {
        std::vector<double> s(t + 1);
        double mx = -1e30, sum = 0.0;
        for (int u = 0; u <= t; u++) {
            double d = 0;
            for (int i = 0; i < hs; i++) { d += (double)qkv[(b * T + t) * 3 * C + h * hs + i] * qkv[(b * T + u) * 3 * C + C + h * hs + i]; }
            s[u] = d / sqrt((double)hs);
            mx = fmax(mx, s[u]);
        }
        for (int u = 0; u <= t; u++) { s[u] = exp(s[u] - mx); sum += s[u]; }
        for (int i = 0; i < hs; i++) {
            double o = 0;
            for (int u = 0; u <= t; u++) { o += s[u] / sum * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i]; }
            fwd = fmax(fwd, fabs(o - out[(b * T + t) * C + h * hs + i]));
        }
    }
    std::vector<float> dqkv = randn(B * T * 3 * C);   // garbage: backward must overwrite it
    attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
    double e = finite_difference_error(qkv, dqkv, loss, 1e-2f);
    char detail[96];
    snprintf(detail, sizeof(detail), "forward abs err %.1e, fd rel err %.2e", fwd, e);
    report("causal attention forward and backward", fwd < 1e-5 && e < 1e-2, detail);
}

static void test_encoder() {
    int B = 3, T = 5, C = 40, V = 4;   // few tokens: many positions share a row of wte
    std::vector<int> inp(B * T);
    for (auto& t : inp) { t = (int)(rng_u32(&rng) % V); }
    std::vector<float> wte = randn(V * C), wpe = randn(T * C), out(B * T * C), dout = randn(B * T * C);
    encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    double fwd = 0.0;
    for (int i = 0; i < B * T; i++) for (int c = 0; c < C; c++) {
        fwd = fmax(fwd, fabs(out[i * C + c] - (wte[inp[i] * C + c] + wpe[(i % T) * C + c])));
    }
    std::vector<double> dwte_ref(V * C, 0.0), dwpe_ref(T * C, 0.0);
    for (int i = 0; i < B * T; i++) for (int c = 0; c < C; c++) {
        dwte_ref[inp[i] * C + c] += dout[i * C + c];
        dwpe_ref[(i % T) * C + c] += dout[i * C + c];
    }
    std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
    encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
    double bwd = 0.0;
    for (int i = 0; i < V * C; i++) { bwd = fmax(bwd, fabs(dwte[i] - dwte_ref[i])); }
    for (int i = 0; i < T * C; i++) { bwd = fmax(bwd, fabs(dwpe[i] - dwpe_ref[i])); }
    char detail[96];
    snprintf(detail, sizeof(detail), "forward err %.1e, backward abs err %.1e", fwd, bwd);
    report("encoder forward and backward (repeated tokens)", fwd == 0.0 && bwd < 1e-5, detail);
}

static void test_classifier() {
    int B = 2, T = 3, V = 10, Vp = 16, N = B * T;
    std::vector<float> logits = randn(N * Vp, 3.0f), weights(N), losses(N);
    std::vector<int> targets(N);
    for (int i = 0; i < N; i++) { targets[i] = (int)(rng_u32(&rng) % V); weights[i] = (i % 3 == 0) ? 0.0f : 1.0f + i; }
    for (int i = 0; i < N; i++) for (int v = V; v < Vp; v++) { logits[i * Vp + v] = 100.0f; }   // padding must be ignored
    std::vector<float> x = logits;
    float dloss = 0.25f;
    fused_classifier(x.data(), losses.data(), weights.data(), targets.data(), dloss, B, T, V, Vp, 1);
    double loss_err = 0.0, grad_err = 0.0, pad = 0.0;
    for (int i = 0; i < N; i++) {
        double mx = -1e30, sum = 0.0;
        for (int v = 0; v < V; v++) { mx = fmax(mx, logits[i * Vp + v]); }
        for (int v = 0; v < V; v++) { sum += exp(logits[i * Vp + v] - mx); }
        double ce = log(sum) + mx - logits[i * Vp + targets[i]];
        loss_err = fmax(loss_err, fabs(losses[i] - weights[i] * ce));
        for (int v = 0; v < V; v++) {
            double p = exp(logits[i * Vp + v] - mx) / sum;
            double g = dloss * weights[i] * (p - (v == targets[i]));
            grad_err = fmax(grad_err, fabs(x[i * Vp + v] - g));
        }
        for (int v = V; v < Vp; v++) { pad = fmax(pad, fabs(x[i * Vp + v])); }
    }
    char detail[96];
    snprintf(detail, sizeof(detail), "loss err %.1e, dlogits err %.1e, padding %.0e", loss_err, grad_err, pad);
    report("fused classifier with loss weights and padded vocab", loss_err < 1e-5 && grad_err < 1e-6 && pad == 0.0, detail);
}

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
        for (auto* vec : {&dwte, &dwpe, &dx, &dw, &db}) { results[k].insert(results[k].end(), vec->begin(), vec->end()); }
        results[k].push_back(norm);
    }
    omp_set_num_threads(saved);
    int same = memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)) == 0;
    report("encoder/layernorm backward and norm: 1 thread == 2 threads", same, same ? "bit-identical" : "differ");
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
