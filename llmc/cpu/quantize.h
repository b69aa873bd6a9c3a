// Block-wise symmetric quantisation, for ZeRO++'s compressed collectives (llmc/parallel/dp_zeropp.h).
// The CUDA twin is llmc/cuda/quantize.cuh: the same names, signatures and wire format.
//
// n values are cut into blocks of QUANT_BLOCK = 256 (the last one may be short); each block is
// sent as one fp32 scale followed by its 256 codes of `bits` bits (8 or 4; a short block's
// missing codes are 0):
//
//   wire:  | scale 0 | q 0 .. q 255 | scale 1 | q 256 .. q 511 | ...      (int32 words)
//   words per block: 1 + 256 bits / 32   (int8: 65 words = 260 bytes, int4: 33 words = 132 bytes)
//
// Math (symmetric, round to nearest): qmax = 2^(bits-1) - 1 (127 or 7),
//   scale = absmax / qmax,   q_i = round(x_i / scale) in [-qmax, qmax],   x'_i = q_i scale
// so |x_i - x'_i| <= scale / 2 = absmax / (2 qmax): 1/254 (int8) or 1/14 (int4) of the block's
// largest magnitude. A block holding a NaN or an infinity gets a NaN scale and all-zero codes:
// it dequantises to NaN everywhere, so a non-finite gradient still reaches the update's check.
// int8 codes are bytes (two's complement); int4 codes are two's complement nibbles, code i in
// byte i/2: the low nibble for even i, the high one for odd i.
//
// stats (a device float[3], or NULL): quantize_blocks adds what the error can be at most,
//   stats[0] = max(stats[0], largest block absmax)      the per-element bound is stats[0] / (2 qmax)
//   stats[1] += sum over blocks of n_b (scale_b / 2)^2   a bound on the squared 2-norm of the error
//   stats[2] += sum over blocks of n_b scale_b / 2       a bound on its 1-norm
// (finite blocks only; on the GPU the order of the sum is not fixed: a statistic, not a result).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../precision.h"   // QUANT_BLOCK and the wire layout's sizes, shared with the CUDA twin
#include "memory.h"   // floatX

static inline void quantize_blocks(int32_t* wire, const floatX* x, size_t n, int bits, float* stats) {
    const int qmax = quant_qmax(bits);
    const size_t nb = quant_num_blocks(n), bw = quant_block_words(bits);
    float amax_all = 0.0f;
    double energy = 0.0, l1 = 0.0;
    #pragma omp parallel for reduction(max : amax_all) reduction(+ : energy, l1)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * QUANT_BLOCK, cnt = n - lo < QUANT_BLOCK ? n - lo : QUANT_BLOCK;
        float amax = 0.0f;
        int finite = 1;
        for (size_t i = 0; i < cnt; i++) {
            float a = fabsf(x[lo + i]);
            if (!isfinite(a)) { finite = 0; } else if (a > amax) { amax = a; }
        }
        float scale = finite ? amax / (float)qmax : NAN;
        float inv = finite && amax > 0.0f ? (float)qmax / amax : 0.0f;
        int32_t* blk = wire + b * bw;
        memcpy(blk, &scale, sizeof(float));
        uint8_t* codes = (uint8_t*)(blk + 1);
        memset(codes, 0, (bw - 1) * sizeof(int32_t));
        for (size_t i = 0; i < cnt; i++) {
            int q = (int)rintf(x[lo + i] * inv);
            q = q > qmax ? qmax : (q < -qmax ? -qmax : q);
            if (bits == 8) { codes[i] = (uint8_t)(int8_t)q; }
            else { codes[i / 2] |= (uint8_t)((q & 0xF) << (4 * (i & 1))); }
        }
        if (finite) {
            amax_all = amax > amax_all ? amax : amax_all;
            energy += (double)cnt * (double)(scale / 2) * (double)(scale / 2);
            l1 += (double)cnt * (double)(scale / 2);
        }
    }
    if (stats) {
        stats[0] = amax_all > stats[0] ? amax_all : stats[0];
        stats[1] += (float)energy;
        stats[2] += (float)l1;
    }
}

// value i of a block: its code (int8 byte or sign-extended nibble) times the block's scale
static inline float quant_value(const int32_t* blk, size_t i, int bits) {
    const uint8_t* codes = (const uint8_t*)(blk + 1);
    int q = bits == 8 ? (int)(int8_t)codes[i] : (((codes[i / 2] >> (4 * (i & 1))) & 0xF) ^ 8) - 8;
    float scale;
    memcpy(&scale, blk, sizeof(float));
    return (float)q * scale;
}

// x[0 .. n) = the dequantised values (rounded to the storage format, as a copy to floatX is)
static inline void dequantize_blocks(floatX* x, const int32_t* wire, size_t n, int bits) {
    const size_t bw = quant_block_words(bits);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        x[i] = quant_value(wire + (i / QUANT_BLOCK) * bw, i % QUANT_BLOCK, bits);
    }
    floatx_round(x, n, ROUND_COPY);
}

// acc[0 .. n) += the dequantised values, in fp32
static inline void dequantize_accumulate(float* acc, const int32_t* wire, size_t n, int bits) {
    const size_t bw = quant_block_words(bits);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        acc[i] += quant_value(wire + (i / QUANT_BLOCK) * bw, i % QUANT_BLOCK, bits);
    }
}

// dst[i] += acc[i] / p (the mean of p ranks' contributions, added to what dst holds; one rounding)
static inline void quant_add_mean(floatX* dst, const float* acc, size_t n, int p) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { dst[i] = dst[i] + acc[i] / (float)p; }
    floatx_round(dst, n, ROUND_COPY);
}
