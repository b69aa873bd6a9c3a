// This machine's two ceilings for --profile's roofline (llmc/train/profile_report.h), measured in
// about half a second at start-up, on all the threads the trainer uses. A ceiling must be a bound
// no operation of the step beats, so each is the best of a few kernels, each the best of a few
// repetitions:
//   compute: the trainer's own matmul kernel (llmc/cpu/matmul.h) on a 512 x 768 x 2304 product,
//            forward (out = inp w^T) and the weight gradient (dw += dout^T inp), operands in cache
//   memory:  two streams over 32 MiB arrays (far larger than the caches), counting the bytes
//            the loop must move as the profile does: a triad a = b + s c (two read, one written,
//            as McCalpin's STREAM) and memset (write only, with stores that skip the cache)
#pragma once

#include <string.h>
#include "../common.h"   // wall_seconds
#include "matmul.h"      // the products it times

// the best time of fn() over at least 3 repetitions and about `seconds`
template <typename F> static inline double ceilings_best_time(F fn, double seconds) {
    double best = 1e30, start = wall_seconds();
    for (int rep = 0; rep < 50 && (rep < 3 || wall_seconds() - start < seconds); rep++) {
        double t0 = wall_seconds();
        fn();
        double dt = wall_seconds() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

static inline void backend_measure_ceilings(double* flops_per_s, double* bytes_per_s, char* how, size_t how_size) {
    const int M = 512, K = 768, N = 2304;
    std::vector<float> a((size_t)M * K), w((size_t)N * K), out((size_t)M * N), dw((size_t)N * K, 0.0f);
    for (size_t i = 0; i < a.size(); i++) { a[i] = 0.001f * (float)(i % 97); }
    for (size_t i = 0; i < w.size(); i++) { w[i] = 0.001f * (float)(i % 89); }
    double fwd = ceilings_best_time([&] { matmul_forward(out.data(), a.data(), w.data(), NULL, 1, M, K, N); }, 0.12);
    double bwd = ceilings_best_time([&] { matmul_backward(NULL, dw.data(), NULL, out.data(), a.data(), w.data(), 1, M, K, N); }, 0.12);
    *flops_per_s = 2.0 * M * K * N / (fwd < bwd ? fwd : bwd);

    const size_t n = (size_t)8 << 20;   // 32 MiB of floats per array
    float* x = (float*)malloc(n * sizeof(float));
    float* y = (float*)malloc(n * sizeof(float));
    float* z = (float*)malloc(n * sizeof(float));
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { x[i] = 0.0f; y[i] = 1.0f; z[i] = 2.0f; }   // the pages, touched by the threads that use them
    double triad = ceilings_best_time([&] {
        #pragma omp parallel for
        for (size_t i = 0; i < n; i++) { x[i] = y[i] + 0.5f * z[i]; }
    }, 0.04);
    double fill = ceilings_best_time([&] { memset(x, 0, n * sizeof(float)); }, 0.04);   // as zeroing the gradients
    double bw_triad = 3.0 * n * sizeof(float) / triad, bw_fill = n * sizeof(float) / fill;
    *bytes_per_s = bw_triad > bw_fill ? bw_triad : bw_fill;
    free(x); free(y); free(z);
    snprintf(how, how_size, "our matmul on %dx%dx%d: forward %.1f, weight gradient %.1f GFLOP/s; streams over 32 MiB: "
             "triad %.1f, memset %.1f GB/s", M, K, N, 2e-9 * M * K * N / fwd, 2e-9 * M * K * N / bwd, bw_triad * 1e-9,
             bw_fill * 1e-9);
}
