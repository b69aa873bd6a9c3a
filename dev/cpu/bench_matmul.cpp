// Benchmark + validation of the CPU matmul (llmc/cpu/matmul.h) on the GPT-2 124M shapes.
//
// Build with OpenBLAS (validates ours vs naive and vs cblas_sgemm; times ours and OpenBLAS):
//   g++ -O3 -march=native -fopenmp -DLLMC_OPENBLAS $(pkg-config --cflags openblas) dev/cpu/bench_matmul.cpp -o bench_matmul $(pkg-config --libs openblas)
// Build without (validates ours vs naive; times ours only):
//   g++ -O3 -march=native -fopenmp dev/cpu/bench_matmul.cpp -o bench_matmul
// Run:
//   OMP_NUM_THREADS=2 ./bench_matmul [BT] [tiny]   (BT = B*T, default 4*64 = 256; tiny: the default
//                                                   job's shapes, C = 128, in place of GPT-2 124M's;
//                                                   that job runs them at BT = 32*64 = 2048)
//
// Checks, for each shape (exit code 1 if any fails):
//  - ours (and OpenBLAS) vs the naive triple loops: error = max|x - ref| / max|ref| <= 1e-4,
//    for out, dinp, dweight (accumulated onto random values) and dbias. The naive code is
//    slow, so it is run on a sample of complete rows: every s-th row (s = 5, 11, 17, ...:
//    coprime with the 6x32 register block, so all positions in a block get checked), plus
//    the last row; s grows with the shape to bound the time.
//  - ours vs OpenBLAS on all elements (same tolerance), when built with OpenBLAS;
//  - ours is bit-identical on a second run, and with 1 thread (if run with more);
//    OpenBLAS is bit-identical on a second run.
// Timings: best of several runs, after a warm-up. GFLOP/s counts 2*BT*C*OC for the forward
// and 4*BT*C*OC for the backward; "speed ours/OpenBLAS" = OpenBLAS time / our time.
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include "../../llmc/cpu/matmul.h"
#include "../../llmc/cpu/matmul_naive.h"

typedef std::vector<float> Vec;

static void fill_random(Vec& v, unsigned long long& state) {  // uniform in [-1, 1)
    for (float& x : v) {
        state ^= state >> 12; state ^= state << 25; state ^= state >> 27;  // xorshift64*
        x = (float)((state * 2685821657736338717ULL) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
    }
}

struct MaxErr {  // accumulates max |x - ref| and max |ref|
    double diff = 0.0, ref = 0.0;
    void add(const float* x, const float* r, size_t n) {
        for (size_t i = 0; i < n; i++) {
            diff = std::max(diff, (double)fabsf(x[i] - r[i]));
            ref = std::max(ref, (double)fabsf(r[i]));
        }
    }
    double rel() const { return ref > 0.0 ? diff / ref : diff; }
};

// rows 0, s, 2s, ... and n-1, with s in 5, 11, 17, ... so that rows * work_per_row <= ~3e8
static std::vector<int> sample_rows(int n, double work_per_row) {
    int s = 5;
    while ((n / s) * work_per_row > 3e8) { s += 6; }
    std::vector<int> rows;
    for (int i = 0; i < n; i += s) { rows.push_back(i); }
    if (rows.back() != n - 1) { rows.push_back(n - 1); }
    return rows;
}

struct Problem {
    int BT, C, OC;
    Vec inp, weight, bias, dout, dweight0, dbias0;  // dweight0/dbias0: gradients before backward
};
struct Result { Vec out, dinp, dweight, dbias; };

typedef void (*ForwardFn)(float*, const float*, const float*, const float*, int, int, int, int);
typedef void (*BackwardFn)(float*, float*, float*, const float*, const float*, const float*, int, int, int, int);

static Result run_once(const Problem& P, ForwardFn fwd, BackwardFn bwd) {
    Result r;
    r.out.assign((size_t)P.BT * P.OC, 0.0f);
    r.dinp.assign((size_t)P.BT * P.C, 0.0f);
    r.dweight = P.dweight0;
    r.dbias = P.dbias0;
    fwd(r.out.data(), P.inp.data(), P.weight.data(), P.bias.data(), 1, P.BT, P.C, P.OC);
    bwd(r.dinp.data(), r.dweight.data(), r.dbias.data(), P.dout.data(), P.inp.data(), P.weight.data(), 1, P.BT, P.C, P.OC);
    return r;
}

static bool same_bits(const Result& a, const Result& b) {
    return a.out == b.out && a.dinp == b.dinp && a.dweight == b.dweight && a.dbias == b.dbias;
}

// max relative error of r against the naive reference, on sampled rows
static double error_vs_naive(const Problem& P, const Result& r) {
    int BT = P.BT, C = P.C, OC = P.OC;
    MaxErr e_out, e_dinp, e_dw, e_db;
    Vec ref_out(OC), ref_dinp(C), scratch_dw((size_t)OC * C), ref_dw(C), scratch_dinp((size_t)BT * C), dout_col(BT);
    for (int bt : sample_rows(BT, 2.0 * C * OC)) {  // one row of out and of dinp = a batch of 1
        const float* x = P.inp.data() + (size_t)bt * C;
        const float* g = P.dout.data() + (size_t)bt * OC;
        matmul_forward_naive(ref_out.data(), x, P.weight.data(), P.bias.data(), 1, 1, C, OC);
        e_out.add(r.out.data() + (size_t)bt * OC, ref_out.data(), OC);
        matmul_backward_naive(ref_dinp.data(), scratch_dw.data(), NULL, g, x, P.weight.data(), 1, 1, C, OC);
        e_dinp.add(r.dinp.data() + (size_t)bt * C, ref_dinp.data(), C);
    }
    for (int o : sample_rows(OC, 2.0 * BT * C)) {  // one row of dweight = a layer with one output
        for (int bt = 0; bt < BT; bt++) { dout_col[bt] = P.dout[(size_t)bt * OC + o]; }
        std::copy(P.dweight0.begin() + (size_t)o * C, P.dweight0.begin() + (size_t)(o + 1) * C, ref_dw.begin());
        float ref_db = P.dbias0[o];
        matmul_backward_naive(scratch_dinp.data(), ref_dw.data(), &ref_db, dout_col.data(), P.inp.data(),
                              P.weight.data() + (size_t)o * C, 1, BT, C, 1);
        e_dw.add(r.dweight.data() + (size_t)o * C, ref_dw.data(), C);
        e_db.add(r.dbias.data() + o, &ref_db, 1);
    }
    return std::max(std::max(e_out.rel(), e_dinp.rel()), std::max(e_dw.rel(), e_db.rel()));
}

#ifdef LLMC_OPENBLAS
static double error_vs(const Result& a, const Result& ref) {  // all elements
    MaxErr e[4];
    e[0].add(a.out.data(), ref.out.data(), a.out.size());
    e[1].add(a.dinp.data(), ref.dinp.data(), a.dinp.size());
    e[2].add(a.dweight.data(), ref.dweight.data(), a.dweight.size());
    e[3].add(a.dbias.data(), ref.dbias.data(), a.dbias.size());
    return std::max(std::max(e[0].rel(), e[1].rel()), std::max(e[2].rel(), e[3].rel()));
}
#endif

struct Timing { double fwd_ms, bwd_ms; };

// best-of-reps times of forward and backward (gradients keep accumulating; harmless here)
static Timing time_it(const Problem& P, ForwardFn fwd, BackwardFn bwd, int reps) {
    Result r = run_once(P, fwd, bwd);  // warm-up (and buffers)
    Timing t = {1e30, 1e30};
    for (int i = 0; i < reps; i++) {
        double t0 = omp_get_wtime();
        fwd(r.out.data(), P.inp.data(), P.weight.data(), P.bias.data(), 1, P.BT, P.C, P.OC);
        double t1 = omp_get_wtime();
        bwd(r.dinp.data(), r.dweight.data(), r.dbias.data(), P.dout.data(), P.inp.data(), P.weight.data(), 1, P.BT, P.C, P.OC);
        double t2 = omp_get_wtime();
        t.fwd_ms = std::min(t.fwd_ms, (t1 - t0) * 1e3);
        t.bwd_ms = std::min(t.bwd_ms, (t2 - t1) * 1e3);
    }
    return t;
}

int main(int argc, char** argv) {
    int BT = (argc > 1) ? atoi(argv[1]) : 256;
    bool tiny = argc > 2 && strcmp(argv[2], "tiny") == 0;
    std::vector<std::pair<int, int>> shapes = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}};  // (C, OC)
    if (tiny) { shapes = {{128, 384}, {128, 128}, {128, 512}, {512, 128}, {128, 320}}; }   // the default job's model
    const double tol = 1e-4;
    int nthreads = omp_get_max_threads();
    bool all_ok = true;
    unsigned long long rng = 1337;

    printf("matmul benchmark: BT=%d, %d OpenMP thread(s), ours: %dx%d register block (%s)\n", BT, nthreads,
           MM_MR, MM_NR, MM_NR == 32 ? "AVX-512" : "AVX2");
#ifdef LLMC_OPENBLAS
    printf("OpenBLAS: %s, called single-threaded from each OpenMP thread\n", openblas_get_config());
#else
    printf("built without OpenBLAS: ours only\n");
#endif
    printf("\n    C     OC |  ours fwd ms  GFLOP/s | ours bwd ms  GFLOP/s | err vs naive");
#ifdef LLMC_OPENBLAS
    printf(" | BLAS fwd ms  GFLOP/s | BLAS bwd ms  GFLOP/s | BLAS vs naive | ours vs BLAS | speed ours/BLAS fwd  bwd");
#endif
    printf("\n");

    double total_flops = 0.0, total_ours = 0.0, total_blas = 0.0;
    for (const auto& shape : shapes) {
        Problem P;
        P.BT = BT; P.C = shape.first; P.OC = shape.second;
        int C = P.C, OC = P.OC;
        P.inp.resize((size_t)BT * C); P.weight.resize((size_t)OC * C); P.bias.resize(OC);
        P.dout.resize((size_t)BT * OC); P.dweight0.resize((size_t)OC * C); P.dbias0.resize(OC);
        for (Vec* v : {&P.inp, &P.weight, &P.bias, &P.dout, &P.dweight0, &P.dbias0}) { fill_random(*v, rng); }
        bool ok = true;

        // correctness of ours, and determinism
        Result ours = run_once(P, matmul_forward_blocked, matmul_backward_blocked);
        double err_ours = error_vs_naive(P, ours);
        ok = ok && err_ours <= tol;
        if (!same_bits(ours, run_once(P, matmul_forward_blocked, matmul_backward_blocked))) {
            printf("FAIL: C=%d OC=%d, ours differs between two identical runs\n", C, OC);
            ok = false;
        }
        if (nthreads > 1) {
            omp_set_num_threads(1);
            if (!same_bits(ours, run_once(P, matmul_forward_blocked, matmul_backward_blocked))) {
                printf("FAIL: C=%d OC=%d, ours with 1 thread differs from ours with %d\n", C, OC, nthreads);
                ok = false;
            }
            omp_set_num_threads(nthreads);
        }

        double flops = 2.0 * BT * C * OC;
        int reps = (flops > 5e9) ? 5 : 20;
        Timing t = time_it(P, matmul_forward_blocked, matmul_backward_blocked, reps);
        total_flops += 3.0 * flops;
        total_ours += t.fwd_ms + t.bwd_ms;
        printf("%5d %6d | %11.3f %8.1f | %11.3f %8.1f | %7.1e %-4s", C, OC, t.fwd_ms, flops / t.fwd_ms * 1e-6,
               t.bwd_ms, 2 * flops / t.bwd_ms * 1e-6, err_ours, err_ours <= tol ? "ok" : "FAIL");
#ifdef LLMC_OPENBLAS
        Result blas = run_once(P, matmul_forward_openblas, matmul_backward_openblas);
        double err_blas = error_vs_naive(P, blas), err_ours_blas = error_vs(ours, blas);
        ok = ok && err_blas <= tol && err_ours_blas <= tol;
        if (!same_bits(blas, run_once(P, matmul_forward_openblas, matmul_backward_openblas))) {
            printf("FAIL: C=%d OC=%d, OpenBLAS differs between two identical runs\n", C, OC);
            ok = false;
        }
        Timing tb = time_it(P, matmul_forward_openblas, matmul_backward_openblas, reps);
        total_blas += tb.fwd_ms + tb.bwd_ms;
        printf(" | %11.3f %8.1f | %11.3f %8.1f | %8.1e %-4s | %7.1e %-4s | %19.2f %4.2f", tb.fwd_ms, flops / tb.fwd_ms * 1e-6,
               tb.bwd_ms, 2 * flops / tb.bwd_ms * 1e-6, err_blas, err_blas <= tol ? "ok" : "FAIL",
               err_ours_blas, err_ours_blas <= tol ? "ok" : "FAIL", tb.fwd_ms / t.fwd_ms, tb.bwd_ms / t.bwd_ms);
#endif
        printf("\n");
        fflush(stdout);
        all_ok = all_ok && ok;
    }
    printf("\nall shapes, forward + backward: ours %.1f ms = %.1f GFLOP/s", total_ours, total_flops / total_ours * 1e-6);
#ifdef LLMC_OPENBLAS
    printf(", OpenBLAS %.1f ms = %.1f GFLOP/s, speed ours/OpenBLAS %.2f", total_blas, total_flops / total_blas * 1e-6,
           total_blas / total_ours);
#else
    (void)total_blas;
#endif
    printf("\n%s\n", all_ok ? "PASS" : "FAIL");
    return all_ok ? 0 : 1;
}
