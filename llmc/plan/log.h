// The step line, as llm.c prints it:
//   step   12/200 | loss 2.3456 | norm 0.98 | lr 3.0e-04 | 45.2 ms | 12,345 tok/s | MFU n/a
// MFU = achieved FLOP/s / the device's peak. The CPU backend has no table of peaks, so it
// prints n/a (never a made-up number) and reports achieved GFLOP/s in the benchmark instead.
#pragma once

#include <stdio.h>
#include <string.h>

// 12345678 -> "12,345,678"
static inline const char* with_commas(double x, char* buf, size_t size) {
    char digits[32];
    snprintf(digits, sizeof(digits), "%.0f", x);
    int len = (int)strlen(digits), out = 0;
    for (int i = 0; i < len && out + 2 < (int)size; i++) {
        buf[out++] = digits[i];
        int left = len - 1 - i;
        if (left > 0 && left % 3 == 0 && digits[i] != '-') { buf[out++] = ','; }
    }
    buf[out] = '\0';
    return buf;
}

static inline void print_step_line(int step, int steps, float loss, float norm, float lr, double seconds,
                            double tokens, double mfu_percent, const char* extra) {
    char tps[32];
    printf("step %4d/%d | loss %.4f | norm %.2f | lr %.1e | %s%.1f ms | %s tok/s | ", step, steps, loss, norm, lr,
           extra ? extra : "", seconds * 1e3, with_commas(tokens / seconds, tps, sizeof(tps)));
    if (mfu_percent >= 0) { printf("MFU %.1f%%\n", mfu_percent); }
    else { printf("MFU n/a\n"); }
    fflush(stdout);
}

// After the run: the mean of the timed steps (every step but the first, which warms caches up)
static inline void print_average_step(double seconds, int steps, double tokens, double flops, int threads) {
    double s = seconds / steps;
    char tps[32];
    printf("average step (excluding the first): %.1f ms | %s tok/s | %.1f GFLOP/s | %d threads\n", s * 1e3,
           with_commas(tokens / s, tps, sizeof(tps)), flops / s * 1e-9, threads);
}
