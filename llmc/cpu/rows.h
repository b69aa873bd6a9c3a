// Moving rows between layouts, and fp32 buffers filled and summed: what ring attention
// (llmc/parallel/cp_ring.h) does around its block kernels (llmc/cpu/attention_block.h): packing
// this rank's k | v for the ring, storing the merged fp32 output as floatX, summing the dK,dV
// that travel the ring. A tensor of B sequences of rows is (pointer p, seq, ld): element
// (b, i, c) is at p[((size_t)b * seq + i) * ld + c].
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format

#include <string.h>

// dst(b, i, c) = src(b, i, c) for b < B, i < rows, c < width.
static inline void copy_rows(float* dst, int dst_seq, int dst_ld, const float* src, int src_seq, int src_ld,
                             int B, int rows, int width) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < rows; i++) {
            memcpy(dst + ((size_t)b * dst_seq + i) * dst_ld, src + ((size_t)b * src_seq + i) * src_ld,
                   (size_t)width * sizeof(float));
        }
    }
}
// the same from fp32 to floatX (on the CPU both are float: a copy, rounded under --precision)
static inline void store_rows(float* dst, int dst_seq, int dst_ld, const float* src, int src_seq, int src_ld,
                              int B, int rows, int width) {
    copy_rows(dst, dst_seq, dst_ld, src, src_seq, src_ld, B, rows, width);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < rows; i++) { floatx_round(dst + ((size_t)b * dst_seq + i) * dst_ld, (size_t)width, ROUND_ACT); }
    }
}
// dst[i] += src[i]
static inline void add_floats(float* dst, const float* src, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { dst[i] += src[i]; }
}
static inline void fill_floats(float* p, float value, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { p[i] = value; }
}
