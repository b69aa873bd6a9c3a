// Sum of squares of a tensor, for the global gradient norm used in clipping:
//   norm = sqrt( sum over all gradients g^2 ),   clip: g *= clip / norm  when norm > clip
// (the scale is passed to adamw_update as grad_scale, so gradients are never rewritten).
// The sum is split into fixed chunks whose partial sums are added in a fixed order, so the
// result is the same for any number of threads. Accumulated in double, in vector lanes; out is one float.
#pragma once

#include <stddef.h>
#include <stdlib.h>
#include "../common.h"    // ceil_div
#include "../profile.h"   // PROFILE_OP, cost_global_norm

static inline void global_norm_squared(float* out, const float* values, size_t count) {
    PROFILE_OP("global norm", OP_UPD, cost_global_norm((double)count));
    const size_t CHUNK = 16384;
    size_t nchunks = ceil_div(count, CHUNK);
    double* partial = (double*)malloc((nchunks + 1) * sizeof(double));
    #pragma omp parallel for
    for (size_t c = 0; c < nchunks; c++) {
        size_t start = c * CHUNK, end = start + CHUNK < count ? start + CHUNK : count;
        double s = 0.0;
        #pragma omp simd reduction(+ : s)
        for (size_t i = start; i < end; i++) { s += (double)values[i] * values[i]; }
        partial[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) { total += partial[c]; }
    free(partial);
    *out = (float)total;
}
