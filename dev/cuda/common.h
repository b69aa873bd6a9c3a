// Shared helpers of the kernel lab (dev/cuda/*.cu): error checks, bf16 <-> float on the host,
// random inputs, validation against the CPU reference, timing with CUDA events, and the
// device's peak figures for the "ratio to the floor" column.
//
// Shapes: GPT-2 124M's by default (README.md). `--small` (and, by default, a build for the CPU
// emulator, dev/emu: LLMC_EMU) selects small, awkward shapes that run in seconds there and
// still reach every code path of every version (see each file's "Small shapes" line).
// Under the emulator nothing is timed: its clock measures the host, not a GPU.
//
// Include it AFTER llmc/cuda/backend.cuh (every production kernel, floatX = __nv_bfloat16, or
// float with -DENABLE_FP32, and backend_init). The lab's own error check is labCheck (the
// backend's cudaCheck works too).
//
// The CPU reference kernels (llmc/cpu/*.h) are included inside `namespace cpu { ... }`
// because they have the same names as the CUDA ones: cpu::layernorm_forward is the reference,
// layernorm_forward the production kernel. The system headers they need are included here
// first, so that nothing of the C library ends up inside the namespace.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <algorithm>
#include <vector>
#include <omp.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "../../llmc/common.h"   // die(), ceil_div(): the CPU reference headers use them

// ---------------------------------------------------------------------------------------
// Errors

static inline void lab_cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "[CUDA ERROR] at %s:%d: %s\n", file, line, cudaGetErrorString(err));
        exit(EXIT_FAILURE);
    }
}
#define labCheck(err) lab_cuda_check((err), __FILE__, __LINE__)
// after every launch: launch errors now, execution errors at the next synchronising call
#define LAB_LAUNCH_CHECK() labCheck(cudaGetLastError())

// ---------------------------------------------------------------------------------------
// bf16 on the host. bf16 is the top half of an fp32: 1 sign, 8 exponent, 7 mantissa bits.
// Rounding to nearest-even: add 0x7fff plus the lowest kept bit, then cut the low 16 bits.

static inline float bf16_bits_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t float_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 0x40); }   // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

// float <-> floatX element, on the host
static inline float host_to_float(float x) { return x; }
static inline float host_to_float(__nv_bfloat16 x) {
    __nv_bfloat16_raw r = x;   // the raw 16 bits
    return bf16_bits_to_float(r.x);
}
static inline void host_from_float(float* dst, float x) { *dst = x; }
static inline void host_from_float(__nv_bfloat16* dst, float x) {
    __nv_bfloat16_raw r;
    r.x = float_to_bf16_bits(x);
    *dst = __nv_bfloat16(r);
}
// 1 when floatX is narrower than fp32: selects the bf16 tolerances
static const int LAB_BF16 = sizeof(floatX) == 2;

// 1 in a build for the CPU emulator (dev/emu): small shapes by default, nothing timed
#ifdef LLMC_EMU
static const int LAB_EMULATED = 1;
#else
static const int LAB_EMULATED = 0;
#endif
// 1: the small shapes (--small, or the emulator's default); set by lab_parse_version
static int lab_small = LAB_EMULATED;

// Round a host array to what a floatX tensor can hold, in place: the CPU reference then runs
// on exactly the inputs the GPU sees, and the comparison measures only the kernel's error.
static inline void round_to_floatX(float* x, size_t n) {
    if (LAB_BF16) { for (size_t i = 0; i < n; i++) { x[i] = round_to_bf16(x[i]); } }
}

// ---------------------------------------------------------------------------------------
// Random inputs on the host (xorshift64*: fixed seed, same inputs on every machine)

static uint64_t lab_rng_state = 0x2545F4914F6CDD1DULL;
static inline void lab_seed(uint64_t s) { lab_rng_state = s * 0x9E3779B97F4A7C15ULL + 1; }
static inline uint32_t lab_rand_u32() {
    lab_rng_state ^= lab_rng_state >> 12;
    lab_rng_state ^= lab_rng_state << 25;
    lab_rng_state ^= lab_rng_state >> 27;
    return (uint32_t)((lab_rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}
static inline float lab_rand_uniform() { return (lab_rand_u32() >> 8) * (1.0f / 16777216.0f); }   // [0, 1)

static inline float* host_alloc(size_t n) {
    float* p = (float*)malloc(n * sizeof(float) + 16);
    if (p == NULL) { die("out of host memory (%.1f MiB)", n * 4.0 / 1048576.0); }
    return p;
}
// uniform in [lo, hi), rounded to floatX
static inline float* make_random_float(size_t n, float lo, float hi) {
    float* x = host_alloc(n);
    for (size_t i = 0; i < n; i++) { x[i] = lo + (hi - lo) * lab_rand_uniform(); }
    round_to_floatX(x, n);
    return x;
}
// normal(0, std) by Box-Muller, rounded to floatX
static inline float* make_random_normal(size_t n, float std) {
    float* x = host_alloc(n);
    for (size_t i = 0; i < n; i += 2) {
        float u1 = 1.0f - lab_rand_uniform(), u2 = lab_rand_uniform();
        float r = sqrtf(-2.0f * logf(u1)) * std;
        x[i] = r * cosf(6.2831853f * u2);
        if (i + 1 < n) { x[i + 1] = r * sinf(6.2831853f * u2); }
    }
    round_to_floatX(x, n);
    return x;
}
static inline int* make_random_int(size_t n, int upper) {   // in [0, upper)
    int* x = (int*)malloc(n * sizeof(int) + 16);
    if (x == NULL) { die("out of host memory"); }
    for (size_t i = 0; i < n; i++) { x[i] = (int)(lab_rand_u32() % (uint32_t)upper); }
    return x;
}
static inline float* make_zeros(size_t n) {
    float* x = host_alloc(n);
    memset(x, 0, n * sizeof(float));
    return x;
}
static inline float* host_copy(const float* src, size_t n) {
    float* x = host_alloc(n);
    memcpy(x, src, n * sizeof(float));
    return x;
}

// ---------------------------------------------------------------------------------------
// Device buffers: allocate, upload host floats as floatX or float, download as floats.

// (16 bytes of slack on a GPU; none under the emulator, so that its AddressSanitizer build reports
// an access even one element past the end)
template <class T> static inline T* dev_alloc(size_t n) {
    void* p = NULL;
    labCheck(cudaMalloc(&p, n * sizeof(T) + (LAB_EMULATED ? 0 : 16)));
    return (T*)p;
}
static inline floatX* to_device_floatX(const float* host, size_t n) {
    std::vector<floatX> tmp(n);
    for (size_t i = 0; i < n; i++) { host_from_float(&tmp[i], host[i]); }
    floatX* d = dev_alloc<floatX>(n);
    labCheck(cudaMemcpy(d, tmp.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    return d;
}
static inline void upload_floatX(floatX* d, const float* host, size_t n) {
    std::vector<floatX> tmp(n);
    for (size_t i = 0; i < n; i++) { host_from_float(&tmp[i], host[i]); }
    labCheck(cudaMemcpy(d, tmp.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
}
static inline float* to_device_float(const float* host, size_t n) {
    float* d = dev_alloc<float>(n);
    labCheck(cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
static inline int* to_device_int(const int* host, size_t n) {
    int* d = dev_alloc<int>(n);
    labCheck(cudaMemcpy(d, host, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}
static inline void download(float* host, const floatX* d, size_t n) {
    std::vector<floatX> tmp(n);
    labCheck(cudaMemcpy(tmp.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { host[i] = host_to_float(tmp[i]); }
}
#ifndef ENABLE_FP32
static inline void download(float* host, const float* d, size_t n) {   // (floatX is float: the one above)
    labCheck(cudaMemcpy(host, d, n * sizeof(float), cudaMemcpyDeviceToHost));
}
#endif

// ---------------------------------------------------------------------------------------
// Validation: element i passes when |gpu - ref| <= atol + rtol * |ref| (and is finite).
// Prints the worst elements (largest excess over the tolerance) and the error statistics.
// Returns 1 on pass. The tolerances are chosen per kernel and stated in each file.

static inline int validate_host(const float* gpu, const float* ref, size_t n, const char* name, float atol, float rtol) {
    const int NWORST = 5;
    size_t worst[NWORST];
    double worst_excess[NWORST];
    for (int w = 0; w < NWORST; w++) { worst[w] = 0; worst_excess[w] = -INFINITY; }
    size_t nbad = 0;
    double max_abs = 0.0, max_rel = 0.0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)gpu[i] - (double)ref[i]);
        double tol = atol + rtol * fabs((double)ref[i]);
        if (!isfinite(gpu[i]) && isfinite(ref[i])) { diff = INFINITY; }
        if (diff > max_abs) { max_abs = diff; }
        if (fabs(ref[i]) > 1e-6 && diff / fabs(ref[i]) > max_rel) { max_rel = diff / fabs(ref[i]); }
        double excess = diff - tol;
        if (!(diff <= tol)) { nbad++; }
        for (int w = 0; w < NWORST; w++) {   // keep the NWORST largest excesses, sorted
            if (excess > worst_excess[w]) {
                for (int k = NWORST - 1; k > w; k--) { worst[k] = worst[k - 1]; worst_excess[k] = worst_excess[k - 1]; }
                worst[w] = i;
                worst_excess[w] = excess;
                break;
            }
        }
    }
    printf("  %-10s n=%zu max|err| %.3e max rel %.3e (tol %.1e + %.1e|ref|): %zu out of tolerance\n", name, n,
           max_abs, max_rel, atol, rtol, nbad);
    if (nbad > 0) {
        for (int w = 0; w < NWORST && (size_t)w < nbad; w++) {   // the worst offenders only
            size_t i = worst[w];
            printf("    [%zu] gpu %+.6e ref %+.6e diff %.3e\n", i, gpu[i], ref[i], fabs((double)gpu[i] - ref[i]));
        }
    }
    return nbad == 0;
}
template <class T>
static inline int validate_result(const T* d, const float* ref, size_t n, const char* name, float atol, float rtol) {
    float* gpu = host_alloc(n);
    download(gpu, d, n);
    int ok = validate_host(gpu, ref, n, name, atol, rtol);
    free(gpu);
    return ok;
}

// Largest |x|: tolerances of gradients are set relative to their scale.
static inline float max_abs(const float* x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) { m = fmaxf(m, fabsf(x[i])); }
    return m;
}

// ---------------------------------------------------------------------------------------
// The device and its floors. Memory-bound kernels are held against bytes / peak bandwidth,
// compute-bound ones against FLOPs / peak dense bf16 tensor FLOP/s with fp32 accumulation.

typedef struct {
    char name[256];
    int sm_count;
    double peak_bandwidth;   // bytes/s, 0 when unknown
    double peak_flops;       // dense bf16 (fp32 accumulate) tensor-core FLOP/s (fp32 build: fp32), 0 when unknown
    size_t l2_bytes;
} DeviceInfo;

// Peak FLOP/s: the table in llmc/cuda/mfu.h (the one the trainer's MFU uses, so the lab and the
// step line agree): dense (no 2:4 sparsity) bf16 tensor-core rates with fp32 accumulation
// (H100 SXM 989.4, H100 PCIe 756, H200 989.4, A100 312, L40S 362, RTX 4090 165.2 TFLOP/s,
// ...), or the fp32 CUDA-core rate for the fp32 build. Unknown device: 0, printed as n/a.
#include "../../llmc/cuda/mfu.h"

static inline DeviceInfo get_device_info() {
    DeviceInfo d;
    memset(&d, 0, sizeof(d));
    int dev = 0;
    labCheck(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    labCheck(cudaGetDeviceProperties(&prop, dev));
    snprintf(d.name, sizeof(d.name), "%s", prop.name);
    d.sm_count = prop.multiProcessorCount;
    d.l2_bytes = (size_t)prop.l2CacheSize;
    // cudaDeviceProp::memoryClockRate is gone in CUDA 13; the attribute is still there.
    // DDR: two transfers per clock. (kHz * 1e3) * 2 * (bits / 8) = bytes/s
    int mem_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess) { mem_khz = 0; }
    if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) { bus_bits = 0; }
    cudaGetLastError();   // clear an error left by an unsupported attribute
    d.peak_bandwidth = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0);
    d.peak_flops = device_peak_flops(prop.name, LAB_BF16);
    return d;
}

static inline DeviceInfo lab_device_init() {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        fprintf(stderr, "error: no CUDA device (%s): the kernel lab needs a GPU\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        exit(EXIT_FAILURE);
    }
    backend_init(0);   // llmc/cuda/backend.cuh: device 0, and a clear message if this build cannot run on it
    DeviceInfo d = get_device_info();
    printf("device: %s, %d SMs, peak memory bandwidth ", d.name, d.sm_count);
    if (d.peak_bandwidth > 0) { printf("%.0f GB/s", d.peak_bandwidth / 1e9); } else { printf("n/a"); }
    printf(", peak dense %s ", LAB_BF16 ? "bf16 tensor (fp32 accumulate)" : "fp32");
    if (d.peak_flops > 0) { printf("%.1f TFLOP/s\n", d.peak_flops / 1e12); } else { printf("n/a (device not in the table)\n"); }
    if (LAB_EMULATED) {
        printf("emulated (dev/emu): %s shapes; versions are validated, not timed (emulated timings have no meaning)\n",
               lab_small ? "small" : "full");
    }
    return d;
}

// ---------------------------------------------------------------------------------------
// Timing. Each repeat: flush the L2 cache (write a buffer twice its size), then time one call
// with CUDA events. Returns the median in milliseconds: robust to the odd slow run.

static char* lab_flush_buffer = NULL;
static size_t lab_flush_bytes = 0;

// Under the emulator: returns 0 without running anything (print_bench then says so).
template <class F> static inline float benchmark_ms(int repeats, F&& fn) {
    if (LAB_EMULATED) { return 0.0f; }
    if (lab_flush_buffer == NULL) {
        DeviceInfo d = get_device_info();
        lab_flush_bytes = std::max<size_t>(2 * d.l2_bytes, 1 << 20);
        labCheck(cudaMalloc(&lab_flush_buffer, lab_flush_bytes));
    }
    cudaEvent_t start, stop;
    labCheck(cudaEventCreate(&start));
    labCheck(cudaEventCreate(&stop));
    fn();   // warm-up: first-call costs (module load, cuBLAS heuristics) are not timed
    labCheck(cudaDeviceSynchronize());
    std::vector<float> times;
    for (int r = 0; r < repeats; r++) {
        labCheck(cudaMemset(lab_flush_buffer, r & 0xff, lab_flush_bytes));
        labCheck(cudaEventRecord(start));
        fn();
        labCheck(cudaEventRecord(stop));
        labCheck(cudaEventSynchronize(stop));
        float ms = 0.0f;
        labCheck(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    LAB_LAUNCH_CHECK();
    labCheck(cudaEventDestroy(start));
    labCheck(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// One benchmark line: time, then GB/s against the bandwidth floor (memory-bound kernels,
// flops == 0) or TFLOP/s against the compute floor (flops > 0). "floor" is the time the
// device would need at its peak; the ratio floor/time is the fraction of peak reached.
#define LAB_MAX_VERSIONS 16
static float lab_times[LAB_MAX_VERSIONS + 1];   // ms per version, 0 = not run (for the note in lab_exit)
static const char* lab_kernel_name = "";

static inline void print_bench(const char* kernel, int version, float ms, double bytes, double flops, const DeviceInfo& d) {
    double s = ms * 1e-3;
    if (LAB_EMULATED) {   // no time, no GB/s, no % of peak: the emulator's clock is the host's
        (void)s; (void)bytes; (void)flops; (void)d;
        printf("  time %-22s v%d: not measured (CUDA emulator: emulated timings have no meaning)\n", kernel, version);
        return;
    }
    if (version >= 1 && version <= LAB_MAX_VERSIONS) { lab_times[version] = ms; lab_kernel_name = kernel; }
    printf("  time %-22s v%d: %9.4f ms", kernel, version, ms);
    if (flops > 0) {
        printf(" | %8.2f TFLOP/s", flops / s / 1e12);
        if (d.peak_flops > 0) { printf(" | %5.1f%% of peak", 100.0 * flops / s / d.peak_flops); }
        else { printf(" | peak n/a"); }
    }
    if (bytes > 0) {
        printf(" | %8.1f GB/s", bytes / s / 1e9);
        if (d.peak_bandwidth > 0 && flops <= 0) { printf(" | %5.1f%% of peak bandwidth", 100.0 * bytes / s / d.peak_bandwidth); }
    }
    printf("\n");
}

// ---------------------------------------------------------------------------------------
// Command line and results: "./kernel" runs every version, "./kernel 2" only version 2;
// "--small" (in any position) picks the small shapes, "--full" GPT-2's (the default, except
// under the emulator). Each version prints exactly one "PASS <kernel> v<k> ..." or
// "FAIL <kernel> v<k> ..." line.

// The attention labs' shapes: GPT-2's heads (C 768, NH 12; validation B 4 T 256, benchmark
// B 8 T 1024), or with --small every head size the flash kernels are built for, hs 16, 32, 64
// (tensor cores) and 128 (the fallback), validated at B 2 T 100. Prints them under `name`.
struct LabAttentionShapes {
    int C, NH, Bv, Tv, Bb, Tb;       // benchmark heads; validation and benchmark batch
    int nconf, confC[4], confNH[4];  // the head configurations validated
    char heads[128];                 // "; hs 16 32 64 128" for the PASS lines (empty at full size)
};
static inline LabAttentionShapes lab_attention_shapes(const char* name, bool small) {
    LabAttentionShapes a = {768, 12, 4, 256, 8, 1024, 1, {768, 0, 0, 0}, {12, 0, 0, 0}, ""};
    if (small) {
        const int sc[4] = {48, 64, 128, 128}, snh[4] = {3, 2, 2, 1};
        a.nconf = 4;
        for (int k = 0; k < 4; k++) { a.confC[k] = sc[k]; a.confNH[k] = snh[k]; }
        a.Bv = a.Bb = 2; a.Tv = a.Tb = 100;
        a.C = 128; a.NH = 2;
    }
    printf("%s: C=%d NH=%d; validation B=%d T=%d, benchmark B=%d T=%d\n", name, a.C, a.NH, a.Bv, a.Tv, a.Bb, a.Tb);
    if (a.nconf > 1) {
        int len = snprintf(a.heads, sizeof(a.heads), "; hs");
        for (int k = 0; k < a.nconf; k++) { len += snprintf(a.heads + len, sizeof(a.heads) - len, " %d", a.confC[k] / a.confNH[k]); }
        printf("  small: validation at%s (C/NH =", a.heads + 1);
        for (int k = 0; k < a.nconf; k++) { printf(" %d/%d", a.confC[k], a.confNH[k]); }
        printf(")\n");
    }
    return a;
}

static int lab_failures = 0;

static inline int lab_parse_version(int argc, char** argv, int nversions) {
    setvbuf(stdout, NULL, _IOLBF, 0);   // line-buffered even into a file or pipe: what was printed before a crash is kept
    int version = 0;   // 0: all versions
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--small") == 0) { lab_small = 1; continue; }
        if (strcmp(argv[i], "--full") == 0) { lab_small = 0; continue; }
        if (strcmp(argv[i], "last") == 0 && version == 0) { version = nversions; continue; }   // the production kernel
        char* end = NULL;
        long v = strtol(argv[i], &end, 10);
        if (version != 0 || end == argv[i] || *end != '\0' || v < 1 || v > nversions) {
            fprintf(stderr, "usage: %s [version 1..%d | last] [--small | --full]\n"
                            "       no version: every version; last: the production kernel; --small: small shapes, the\n"
                            "       default under the CPU emulator; --full: GPT-2 124M's, the default on a GPU\n",
                    argv[0], nversions);
            exit(2);
        }
        version = (int)v;
    }
    return version;
}
static inline int lab_selected(int selected, int version) { return selected == 0 || selected == version; }

static inline void lab_report(const char* kernel, int version, const char* what, int ok) {
    printf("%s %s v%d %s\n", ok ? "PASS" : "FAIL", kernel, version, what);
    if (!ok) { lab_failures++; }
}
// The last version is the production kernel (llmc/cuda), which should be the fastest correct
// one: say so when an earlier version beat it by more than 3% (a candidate for llmc/cuda).
static inline int lab_exit() {
    int last = 0;
    for (int v = 1; v <= LAB_MAX_VERSIONS; v++) { if (lab_times[v] > 0) { last = v; } }
    for (int v = 1; v < last; v++) {
        if (lab_times[v] > 0 && lab_times[v] < 0.97f * lab_times[last]) {
            printf("note: %s v%d (%.4f ms) is faster than the last version v%d (%.4f ms, the production kernel)\n",
                   lab_kernel_name, v, lab_times[v], last, lab_times[last]);
        }
    }
    if (lab_failures > 0) { printf("%d version(s) FAILED validation\n", lab_failures); }
    return lab_failures > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

// Block-wide sum with warp shuffles: every thread gets the total. blockDim.x must be a
// multiple of 32 and at most 1024; `shared` holds 32 floats. Used by several lab kernels.
__device__ inline float lab_warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, off); }
    return v;
}
__device__ inline float lab_warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off)); }
    return v;
}
__device__ inline float lab_block_sum(float v, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = lab_warp_sum(v);
    __syncthreads();   // `shared` may still be read by a previous call
    if (lane == 0) { shared[warp] = v; }
    __syncthreads();
    v = lane < nwarps ? shared[lane] : 0.0f;
    return lab_warp_sum(v);
}
__device__ inline float lab_block_max(float v, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = lab_warp_max(v);
    __syncthreads();
    if (lane == 0) { shared[warp] = v; }
    __syncthreads();
    v = lane < nwarps ? shared[lane] : -INFINITY;
    return lab_warp_max(v);
}

// 16 bytes of floatX (8 bf16 or 4 fp32): one 128-bit load or store instruction moves all of
// them. The address must be 16-byte aligned (cudaMalloc'd buffers are 256-byte aligned).
#define LAB_PACK (16 / (int)sizeof(floatX))
struct alignas(16) LabPack16 { floatX v[LAB_PACK]; };

// floatX <-> float on the device (bf16 or, with -DENABLE_FP32, float)
__device__ inline float dev_to_float(float x) { return x; }
__device__ inline float dev_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline floatX dev_from_float(float x) { return (floatX)x; }
