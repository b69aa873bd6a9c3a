// Peak dense FLOP/s of common GPUs, for the MFU in the step line:
//   MFU = (model FLOPs per step / step time) / peak
// Dense (no 2:4 sparsity) tensor-core rates from NVIDIA's datasheets, in TFLOP/s:
//   bf16: bf16 inputs with fp32 accumulation (what our bf16 build runs);
//   fp32: plain fp32 on the CUDA cores (our fp32 build turns TF32 off, so this is its peak).
// Matched on the name cudaGetDeviceProperties reports, most specific entry first; a pattern
// matches when it is followed by the end of the name or a non-alphanumeric character (so
// "A10" does not match "A100", nor "L4" "L40S"). Unknown devices give 0: MFU prints n/a.
// Host code only, no CUDA needed (the CPU build can include it).
#pragma once

#include <string.h>
#include <ctype.h>

typedef struct {
    const char* pattern;
    double bf16_tflops;
    double fp32_tflops;
} DevicePeak;

static const DevicePeak device_peaks[] = {
    {"H100 PCIe", 756.0, 51.2},
    {"H100 NVL", 835.0, 60.0},
    {"H100", 989.4, 66.9},        // SXM5 ("NVIDIA H100 80GB HBM3")
    {"H200 NVL", 835.0, 60.0},
    {"H200", 989.4, 66.9},        // SXM
    {"GH200", 989.4, 66.9},
    {"A100", 312.0, 19.5},        // SXM4 and PCIe share the peak
    {"L40S", 362.0, 91.6},
    {"L40", 181.0, 90.5},
    {"L4", 121.0, 30.3},
    {"A10", 125.0, 31.2},
    {"RTX 4090", 165.2, 82.6},    // GeForce: bf16 with fp32 accumulation runs at half the fp16-accumulate rate
    {"RTX A6000", 154.8, 38.7},
    {"RTX 6000 Ada", 364.2, 91.1},
    {"RTX 3090", 71.0, 35.6},
};

// peak FLOP/s for the device name, bf16 (1) or fp32 (0); 0 when the device is not in the table
static inline double device_peak_flops(const char* name, int bf16) {
    for (size_t i = 0; i < sizeof(device_peaks) / sizeof(device_peaks[0]); i++) {
        const char* pat = device_peaks[i].pattern;
        size_t len = strlen(pat);
        for (const char* p = strstr(name, pat); p != NULL; p = strstr(p + 1, pat)) {
            int starts_word = p == name || !isalnum((unsigned char)p[-1]);
            int ends_word = !isalnum((unsigned char)p[len]);
            if (starts_word && ends_word) {
                return 1e12 * (bf16 ? device_peaks[i].bf16_tflops : device_peaks[i].fp32_tflops);
            }
        }
    }
    return 0.0;
}
