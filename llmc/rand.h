// A small deterministic random number generator (xorshift64*), the same on every platform,
// so a seed gives the same initial weights and the same samples everywhere.
#pragma once
#include <stdint.h>
#include <math.h>

typedef struct { uint64_t state; } Rng;

static inline void rng_init(Rng* r, uint64_t seed) {
    r->state = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;   // never zero
    if (r->state == 0) { r->state = 1; }
}
static inline uint32_t rng_u32(Rng* r) {
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return (uint32_t)((r->state * 0x2545F4914F6CDD1Dull) >> 32);
}
// uniform in [0, 1)
static inline float rng_uniform(Rng* r) { return (rng_u32(r) >> 8) / 16777216.0f; }
// n draws from N(mean, std^2) by the Box-Muller transform
static inline void rng_normal(Rng* r, float* out, size_t n, float mean, float std) {
    const double two_pi = 6.283185307179586;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - rng_uniform(r);   // (0, 1]: log is finite
        double u2 = rng_uniform(r);
        double radius = sqrt(-2.0 * log(u1));
        out[i] = (float)(mean + std * radius * cos(two_pi * u2));
        if (i + 1 < n) { out[i + 1] = (float)(mean + std * radius * sin(two_pi * u2)); }
    }
}
