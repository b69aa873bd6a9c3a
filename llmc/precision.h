// Number formats: rounding a float to BF16, FP16, FP8 E4M3 and FP8 E5M2, on the host.
// The CPU backend stores every floatX tensor rounded with these (--precision bf16|fp16,
// llmc/cpu/memory.h), FP8 matmuls are simulated with them (--fp8, llmc/model/fp8_linear.h), and the tests
// hold them against exact values (test/test_precision.cu). doc/precision.md walks through them.
//
//   format   bits (sign.exponent.mantissa)  bias   largest finite   smallest normal  smallest subnormal
//   FP32     1.8.23                         127    3.40e38          2^-126           2^-149
//   BF16     1.8.7                          127    3.39e38          2^-126           2^-133
//   FP16     1.5.10                         15     65504            2^-14            2^-24
//   E4M3     1.4.3  (OCP "fn": no inf)      7      448              2^-6             2^-9
//   E5M2     1.5.2  (IEEE-like, has inf)    15     57344            2^-14            2^-16
//
// A format with m mantissa bits holds, in the binade [2^e, 2^(e+1)), the multiples of its
// quantum 2^(e-m); below the smallest normal 2^emin the quantum stays 2^(emin-m) (subnormals).
// Rounding to nearest, ties to even (RNE), is what the hardware does on a conversion:
//   normal range     add 2^(k-1) - 1 + (the lowest kept bit) to the fp32 bits, then clear the
//                    k = 23 - m dropped bits (a carry into the exponent is the next binade)
//   subnormal range  rint(x / quantum) * quantum (rint rounds ties to even)
// Overflow: a value whose rounding lands above the largest finite becomes inf (FP16, E5M2,
// BF16: IEEE), or the largest finite (E4M3 has no inf: the OCP "satfinite" conversion, and
// what an FP8 quantiser does to the values a delayed scale did not anticipate).
// NaN stays NaN. Everything here is plain fp32 bit manipulation: the same answer on any
// machine, and on the GPU (llmc/cuda/ uses the hardware's __float2bfloat16_rn).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "common.h"

// host code everywhere; also device code in the CUDA build (the FP8 kernels, llmc/cuda/fp8.cuh)
#ifdef __CUDACC__
#define PREC_HD __host__ __device__
#else
#define PREC_HD
#endif

typedef enum { PREC_FP32, PREC_BF16, PREC_FP16 } Precision;
static inline const char* precision_name(int p) { return p == PREC_BF16 ? "bf16" : p == PREC_FP16 ? "fp16" : "fp32"; }
static inline int precision_parse(const char* s) {   // NULL: the build's own (the caller decides)
    if (s == NULL) { return -1; }
    if (strcmp(s, "fp32") == 0) { return PREC_FP32; }
    if (strcmp(s, "bf16") == 0) { return PREC_BF16; }
    if (strcmp(s, "fp16") == 0) { return PREC_FP16; }
    die("--precision must be fp32, bf16 or fp16, got '%s'", s);
    return -1;
}

PREC_HD static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
PREC_HD static inline float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

// fp32 -> bf16, RNE: bf16 is fp32's upper 16 bits, with fp32's exponent range (subnormals
// included), so the bit trick alone is exact everywhere; a carry out of the largest finite
// gives the exponent 255 with a zero mantissa: inf.
PREC_HD static inline float round_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return x; }   // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return bits_f32(u & 0xffff0000u);
}

// fp32 -> a narrower format with m mantissa bits, smallest normal 2^emin, largest finite
// maxv; saturate: overflow gives +-maxv instead of +-inf.
// 2^e as a float, for -126 <= e <= 127 (built from its bits: no libm call in the loops below)
PREC_HD static inline float pow2f(int e) { return bits_f32((uint32_t)(127 + e) << 23); }

PREC_HD static inline float round_format(float x, int m, int emin, float maxv, int saturate) {
    if (x != x) { return x; }
    float a = fabsf(x), r;
    if (a < pow2f(emin)) {                               // subnormal range: fixed quantum 2^(emin-m)
        r = rintf(a * pow2f(m - emin)) * pow2f(emin - m);  // exact scalings by powers of two
    } else {
        int k = 23 - m;
        uint32_t u = f32_bits(a);
        if (u < 0x7f800000u) { u += (1u << (k - 1)) - 1u + ((u >> k) & 1u); }
        r = bits_f32(u & ~((1u << k) - 1u));
    }
    if (r > maxv) { r = saturate ? maxv : INFINITY; }
    return copysignf(r, x);
}
PREC_HD static inline float round_fp16(float x) { return round_format(x, 10, -14, 65504.0f, 0); }
PREC_HD static inline float round_e4m3(float x) { return round_format(x, 3, -6, 448.0f, 1); }      // saturates: no inf in E4M3
PREC_HD static inline float round_e5m2(float x) { return round_format(x, 2, -14, 57344.0f, 0); }    // IEEE: inf on overflow
PREC_HD static inline float round_e5m2_sat(float x) { return round_format(x, 2, -14, 57344.0f, 1); }
#define E4M3_MAX 448.0f
#define E5M2_MAX 57344.0f

// fp32 -> bf16 STOCHASTICALLY, as the CUDA AdamW writes parameters from the fp32 master
// (llmc/cuda/adamw.cuh): add 16 random bits below the kept bits, then truncate, so the value
// rounds up with probability (distance to the lower bf16) / (bf16 spacing). The bits come from
// the same hash of (element index, seed) as the CUDA kernel's.
PREC_HD static inline uint32_t prec_hash_u32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du;
    x ^= x >> 15; x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
PREC_HD static inline uint32_t stochastic_bits(size_t i, uint32_t seed) {
    return prec_hash_u32(prec_hash_u32((uint32_t)i ^ seed) + (uint32_t)((uint64_t)i >> 32) + 0x9e3779b9u * seed);
}
PREC_HD static inline float round_bf16_stochastic(float x, uint32_t random) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return x; }   // NaN (its payload may sit in the low bits)
    if ((u & 0x7f800000u) != 0x7f800000u) { u += random & 0xffffu; }   // inf kept
    return bits_f32(u & 0xffff0000u);
}

// round a value to the run's storage format
PREC_HD static inline float round_to(int prec, float x) {
    return prec == PREC_BF16 ? round_bf16(x) : prec == PREC_FP16 ? round_fp16(x) : x;
}

// ---- block quantisation to int8 / int4 (ZeRO++, llmc/parallel/dp_zeropp.h): the wire layout that
// llmc/cpu/quantize.h (which explains it) and llmc/cuda/quantize.cuh share. Blocks of QUANT_BLOCK
// values, each one fp32 scale (absmax / qmax) and QUANT_BLOCK codes of `bits` bits, in int32 words.
#define QUANT_BLOCK 256
static inline size_t quant_num_blocks(size_t n) { return (n + QUANT_BLOCK - 1) / QUANT_BLOCK; }
static inline size_t quant_block_words(int bits) { return 1 + (size_t)QUANT_BLOCK * bits / 32; }
// int32 words that n values take on the wire
static inline size_t quant_words(size_t n, int bits) { return quant_num_blocks(n) * quant_block_words(bits); }
static inline int quant_qmax(int bits) { return (1 << (bits - 1)) - 1; }
