// expf written so that the compiler vectorises it (libm's expf is a call, one value at a time):
//   e^x = 2^k e^r,   k = round(x / ln 2),   r = x - k ln 2  in [-ln2/2, ln2/2]
// e^r by its Taylor series to r^7 (truncation < 6e-9 relative on that interval); ln 2 is taken
// in two parts so that r is exact to float precision (Cody and Waite); 2^k is written straight
// into the float's exponent bits. Within 1 ulp of libm's expf (measured over [-87, 88] in steps of
// 7e-4). x is clamped to [-87, 88], where 2^k stays a normal float: e^-87 ~ 1.6e-38 stands for 0
// (a softmax or tanh cannot tell), e^88 ~ 1.7e38 for inf; NaN stays NaN. Used by GELU
// (llmc/cpu/gelu.h) and the softmaxes of attention and the classifier.
// (Vectorised with the Makefile's -fno-math-errno -fno-trapping-math: rintf inline, clamps branch-free.)
#pragma once

#include <math.h>
#include <string.h>

static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float k = rintf(x * 1.44269504f);                                  // x / ln 2, to the nearest integer
    float r = (x - k * 0.693145752f) - k * 1.42860677e-6f;             // ln 2 = 0.693145752 + 1.42860677e-6
    float p = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
              r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int bits = ((int)k + 127) << 23;                                    // the float 2^k
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k));
    return p * two_k;
}
