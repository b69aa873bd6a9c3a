// The linear layer's three products as obviously correct triple loops (the contract of
// llmc/cpu/matmul.h): the reference that test/test_kernels.cu and the benchmark
// (dev/cpu/bench_matmul.cpp) check the fast versions against. Slow; the trainer does not use them.
#pragma once

#include <stddef.h>

static inline void matmul_forward_naive(float* out, const float* inp, const float* weight, const float* bias,
                                        int B, int T, int C, int OC) {
    for (int bt = 0; bt < B * T; bt++) {
        for (int o = 0; o < OC; o++) {
            float val = (bias != NULL) ? bias[o] : 0.0f;
            for (int c = 0; c < C; c++) { val += inp[(size_t)bt * C + c] * weight[(size_t)o * C + c]; }
            out[(size_t)bt * OC + o] = val;
        }
    }
}

static inline void matmul_backward_naive(float* dinp, float* dweight, float* dbias, const float* dout,
                                         const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    for (int bt = 0; bt < BT && dinp != NULL; bt++) {
        for (int c = 0; c < C; c++) {
            float val = 0.0f;
            for (int o = 0; o < OC; o++) { val += dout[(size_t)bt * OC + o] * weight[(size_t)o * C + c]; }
            dinp[(size_t)bt * C + c] = val;
        }
    }
    for (int o = 0; o < OC && dweight != NULL; o++) {
        for (int c = 0; c < C; c++) {
            float val = 0.0f;
            for (int bt = 0; bt < BT; bt++) { val += dout[(size_t)bt * OC + o] * inp[(size_t)bt * C + c]; }
            dweight[(size_t)o * C + c] += val;
        }
        if (dbias != NULL) {
            float val = 0.0f;
            for (int bt = 0; bt < BT; bt++) { val += dout[(size_t)bt * OC + o]; }
            dbias[o] += val;
        }
    }
}
