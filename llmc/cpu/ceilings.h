// This machine's two ceilings for --profile's roofline (llmc/train/profile_report.h), measured in
// about a tenth of a second at start-up, on all the threads the trainer uses:
//   compute: the trainer's own matmul kernel (llmc/cpu/matmul.h) on a 512 x 768 x 2304 product,
//            whose operands fit the caches: the best FLOP/s a GPT-2 step can expect of it
//   memory:  a stream triad a = b + s c over three 32 MiB arrays (far larger than the caches),
//            12 bytes a value counted (two read, one written), as in McCalpin's STREAM
// Each the best of a few repetitions.
#pragma once

static inline void backend_measure_ceilings(double* flops_per_s, double* bytes_per_s, char* how, size_t how_size) {
    const int M = 512, K = 768, N = 2304;
    float* a = (float*)calloc((size_t)M * K, sizeof(float));
    float* w = (float*)calloc((size_t)N * K, sizeof(float));
    float* out = (float*)calloc((size_t)M * N, sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) { a[i] = 0.001f * (float)(i % 97); }
    for (size_t i = 0; i < (size_t)N * K; i++) { w[i] = 0.001f * (float)(i % 89); }
    double best = 1e30, start = wall_seconds();
    for (int rep = 0; rep < 40 && (rep < 4 || wall_seconds() - start < 0.25); rep++) {   // ~0.25 s
        double t0 = wall_seconds();
        matmul_forward(out, a, w, NULL, 1, M, K, N);
        double dt = wall_seconds() - t0;
        best = dt < best ? dt : best;
    }
    *flops_per_s = 2.0 * M * K * N / best;
    free(a); free(w); free(out);

    const size_t n = (size_t)8 << 20;   // 32 MiB of floats per array
    float* x = (float*)malloc(n * sizeof(float));
    float* y = (float*)malloc(n * sizeof(float));
    float* z = (float*)malloc(n * sizeof(float));
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { x[i] = 0.0f; y[i] = 1.0f; z[i] = 2.0f; }   // the pages, touched by the threads that use them
    best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = wall_seconds();
        #pragma omp parallel for
        for (size_t i = 0; i < n; i++) { x[i] = y[i] + 0.5f * z[i]; }
        double dt = wall_seconds() - t0;
        best = dt < best ? dt : best;
    }
    *bytes_per_s = 3.0 * n * sizeof(float) / best;
    free(x); free(y); free(z);
    snprintf(how, how_size, "our matmul kernel on %dx%dx%d; a stream triad over 3 x 32 MiB", M, K, N);
}
