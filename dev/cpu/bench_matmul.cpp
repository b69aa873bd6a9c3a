// Benchmark + validation of the CPU matmul (llmc/cpu/matmul.h) on the GPT-2 124M shapes.
//
// with OpenBLAS (validates ours vs naive and vs cblas_sgemm, times ours and OpenBLAS):
//   g++ -O3 -march=native -fopenmp -DLLMC_OPENBLAS $(pkg-config --cflags openblas) dev/cpu/bench_matmul.cpp -o bench_matmul $(pkg-config --libs openblas)
// without (validates ours vs naive, times ours only):
//   g++ -O3 -march=native -fopenmp dev/cpu/bench_matmul.cpp -o bench_matmul
// run:
//   OMP_NUM_THREADS=2 ./bench_matmul        (optional argument: B*T, default 256)
//
// The naive reference is slow (scalar, cache-unfriendly), so it is evaluated on a sample of
// rows: every 5th row of out/dinp (stride coprime with the 6x32 register block, plus the last
// row) and every 7th row of dweight/dbias, each sampled row complete. Error = max |x - ref|
// over the checked elements / max |ref|; the run fails (exit 1) if any error exceeds 1e-4.
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include "../../llmc/cpu/matmul.h"

static double now_sec() { return omp_get_wtime(); }

static void fill_random(std::vector<float>& v, unsigned long long& state) {
    for (float& x : v) {  // xorshift64*, uniform in [-1, 1)
        state ^= state >> 12; state ^= state << 25; state ^= state >> 27;
        x = (float)((state * 2685821657736338717ULL) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
    }
}

// max |a - ref| / max |ref| over the listed rows (each row has n floats)
struct ErrAcc {
    double maxdiff = 0.0, maxref = 0.0;
    void add(const float* a, const float* ref, int n) {
        for (int i = 0; i < n; i++) {
            maxdiff = std::max(maxdiff, (double)fabsf(a[i] - ref[i]));
            maxref = std::max(maxref, (double)fabsf(ref[i]));
        }
    }
    double rel() const { return maxref > 0.0 ? maxdiff / maxref : maxdiff; }
};

static std::vector<int> sample(int n, int stride) {
    std::vector<int> s;
    for (int i = 0; i < n; i += stride) { s.push_back(i); }
    if (s.back() != n - 1) { s.push_back(n - 1); }
    return s;
}

struct Errors { double out, dinp, dweight, dbias; };

// errors of (out, dinp, dweight, dbias) against the naive reference on sampled rows.
// dweight0/dbias0: the values the gradients held before the (accumulating) backward.
static Errors check_vs_naive(const float* out, const float* dinp, const float* dweight, const float* dbias,
                             const float* inp, const float* weight, const float* bias, const float* dout,
                             const float* dweight0, const float* dbias0, int BT, int C, int OC) {
    ErrAcc eo, ei, ew, eb;
    std::vector<float> ref_out(OC), ref_dinp(C), scratch_dw((size_t)OC * C), ref_dw(C), scratch_di((size_t)BT * C);
    std::vector<float> dout_col(BT);
    for (int bt : sample(BT, 5)) {
        const float* x = inp + (size_t)bt * C;
        const float* g = dout + (size_t)bt * OC;
        matmul_forward_naive(ref_out.data(), x, weight, bias, 1, 1, C, OC);        // one row of out
        eo.add(out + (size_t)bt * OC, ref_out.data(), OC);
        matmul_backward_naive(ref_dinp.data(), scratch_dw.data(), NULL, g, x, weight, 1, 1, C, OC);  // one row of dinp
        ei.add(dinp + (size_t)bt * C, ref_dinp.data(), C);
    }
    for (int o : sample(OC, 7)) {  // one row of dweight = layer with a single output o
        for (int bt = 0; bt < BT; bt++) { dout_col[bt] = dout[(size_t)bt * OC + o]; }
        memcpy(ref_dw.data(), dweight0 + (size_t)o * C, C * sizeof(float));
        float ref_db = dbias0[o];
        matmul_backward_naive(scratch_di.data(), ref_dw.data(), &ref_db, dout_col.data(), inp,
                              weight + (size_t)o * C, 1, BT, C, 1);
        ew.add(dweight + (size_t)o * C, ref_dw.data(), C);
        eb.add(dbias + o, &ref_db, 1);
    }
    return {eo.rel(), ei.rel(), ew.rel(), eb.rel()};
}

#ifdef LLMC_OPENBLAS
static double max_rel(const float* a, const float* ref, size_t n) {
    ErrAcc e;
    e.add(a, ref, (int)n);
    return e.rel();
}
#endif

// best-of time of fn() in ms, after a warm-up call
template <typename F> static double time_ms(F fn, int reps) {
    fn();
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_sec();
        fn();
        best = std::min(best, (now_sec() - t0) * 1e3);
    }
    return best;
}

int main(int argc, char** argv) {
    int BT = (argc > 1) ? atoi(argv[1]) : 256;  // B=4, T=64
    int B = 1, T = BT;
    const int shapes[][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}};
    const double tol = 1e-4;
    bool ok = true;
    unsigned long long rng = 1337;
    printf("matmul benchmark, BT=%d, %d OpenMP threads", BT, omp_get_max_threads());
#ifdef LLMC_OPENBLAS
    openblas_set_num_threads(omp_get_max_threads());
    printf(", OpenBLAS with %d threads (%s)\n", openblas_get_num_threads(), openblas_get_config());
#else
    printf(" (built without OpenBLAS)\n");
#endif
    printf("max rel errors are vs naive (and vs OpenBLAS when built with it); GFLOP/s: fwd 2*BT*C*OC, bwd 4*BT*C*OC\n\n");
    printf("%5s %6s | %-33s | %-19s", "C", "OC", "ours: fwd ms GF/s | bwd ms GF/s", "err vs naive");
#ifdef LLMC_OPENBLAS
    printf(" | %-33s | %-15s | %s", "OpenBLAS: fwd ms GF/s | bwd ms GF/s", "ours/BLAS f  b", "err vs BLAS");
#endif
    printf("\n");

    double tot_ours = 0.0, tot_flops = 0.0;
#ifdef LLMC_OPENBLAS
    double tot_blas = 0.0;
#endif
    for (const auto& sh : shapes) {
        int C = sh[0], OC = sh[1];
        std::vector<float> inp((size_t)BT * C), weight((size_t)OC * C), bias(OC), dout((size_t)BT * OC);
        std::vector<float> dweight0((size_t)OC * C), dbias0(OC);
        fill_random(inp, rng); fill_random(weight, rng); fill_random(bias, rng); fill_random(dout, rng);
        fill_random(dweight0, rng); fill_random(dbias0, rng);

        // --- correctness: one forward + one backward (gradients start from dweight0/dbias0)
        std::vector<float> out((size_t)BT * OC), dinp((size_t)BT * C), dweight(dweight0), dbias(dbias0);
        matmul_forward_blocked(out.data(), inp.data(), weight.data(), bias.data(), B, T, C, OC);
        matmul_backward_blocked(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), B, T, C, OC);
        Errors e = check_vs_naive(out.data(), dinp.data(), dweight.data(), dbias.data(), inp.data(), weight.data(),
                                  bias.data(), dout.data(), dweight0.data(), dbias0.data(), BT, C, OC);
        double err_naive = std::max(std::max(e.out, e.dinp), std::max(e.dweight, e.dbias));
        if (err_naive > tol) {
            ok = false;
            printf("FAIL C=%d OC=%d vs naive: out %.2e dinp %.2e dweight %.2e dbias %.2e\n", C, OC, e.out, e.dinp, e.dweight, e.dbias);
        }
#ifdef LLMC_OPENBLAS
        std::vector<float> bout(out.size()), bdinp(dinp.size()), bdweight(dweight0), bdbias(dbias0);
        matmul_forward_openblas(bout.data(), inp.data(), weight.data(), bias.data(), B, T, C, OC);
        matmul_backward_openblas(bdinp.data(), bdweight.data(), bdbias.data(), dout.data(), inp.data(), weight.data(), B, T, C, OC);
        Errors eb = check_vs_naive(bout.data(), bdinp.data(), bdweight.data(), bdbias.data(), inp.data(), weight.data(),
                                   bias.data(), dout.data(), dweight0.data(), dbias0.data(), BT, C, OC);
        double err_blas_naive = std::max(std::max(eb.out, eb.dinp), std::max(eb.dweight, eb.dbias));
        double err_blas = std::max(std::max(max_rel(out.data(), bout.data(), out.size()),
                                            max_rel(dinp.data(), bdinp.data(), dinp.size())),
                                   std::max(max_rel(dweight.data(), bdweight.data(), dweight.size()),
                                            max_rel(dbias.data(), bdbias.data(), dbias.size())));
        if (err_blas > tol || err_blas_naive > tol) {
            ok = false;
            printf("FAIL C=%d OC=%d: ours vs OpenBLAS %.2e, OpenBLAS vs naive %.2e\n", C, OC, err_blas, err_blas_naive);
        }
#endif
        // determinism: a second run must give bit-identical results
        std::vector<float> out2(out.size()), dinp2(dinp.size()), dweight2(dweight0), dbias2(dbias0);
        matmul_forward_blocked(out2.data(), inp.data(), weight.data(), bias.data(), B, T, C, OC);
        matmul_backward_blocked(dinp2.data(), dweight2.data(), dbias2.data(), dout.data(), inp.data(), weight.data(), B, T, C, OC);
        if (out != out2 || dinp != dinp2 || dweight != dweight2 || dbias != dbias2) {
            ok = false;
            printf("FAIL C=%d OC=%d: results differ between two identical runs\n", C, OC);
        }

        // --- timing (dweight/dbias keep accumulating; values stay finite for these few reps)
        double flops = 2.0 * BT * C * OC;
        int reps = (flops > 5e9) ? 5 : 15;
        double f_ms = time_ms([&] { matmul_forward_blocked(out.data(), inp.data(), weight.data(), bias.data(), B, T, C, OC); }, reps);
        double b_ms = time_ms([&] { matmul_backward_blocked(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), B, T, C, OC); }, reps);
        tot_ours += f_ms + b_ms;
        tot_flops += 3.0 * flops;
        printf("%5d %6d | %7.3f %6.1f | %7.3f %6.1f      | %.1e", C, OC, f_ms, flops / f_ms * 1e-6, b_ms, 2 * flops / b_ms * 1e-6, err_naive);
        printf(err_naive > tol ? " FAIL    " : " ok      ");
#ifdef LLMC_OPENBLAS
        double bf_ms = time_ms([&] { matmul_forward_openblas(bout.data(), inp.data(), weight.data(), bias.data(), B, T, C, OC); }, reps);
        double bb_ms = time_ms([&] { matmul_backward_openblas(bdinp.data(), bdweight.data(), bdbias.data(), dout.data(), inp.data(), weight.data(), B, T, C, OC); }, reps);
        tot_blas += bf_ms + bb_ms;
        printf(" | %7.3f %6.1f | %7.3f %6.1f          | %5.2f %5.2f     | %.1e %s", bf_ms, flops / bf_ms * 1e-6, bb_ms, 2 * flops / bb_ms * 1e-6,
               bf_ms / f_ms, bb_ms / b_ms, err_blas, err_blas > tol ? "FAIL" : "ok");
#endif
        printf("\n");
    }
    printf("\nall shapes, fwd+bwd: ours %.1f ms (%.1f GFLOP/s)", tot_ours, tot_flops / tot_ours * 1e-6);
#ifdef LLMC_OPENBLAS
    printf(", OpenBLAS %.1f ms (%.1f GFLOP/s), ours/OpenBLAS speed %.2f", tot_blas, tot_flops / tot_blas * 1e-6, tot_blas / tot_ours);
#endif
    printf("\n%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
