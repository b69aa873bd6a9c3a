// Global gradient norm (squared), the kernel lab:   out = sum_i g_i^2   over every gradient
// (the trainer takes the sqrt and clips with it). One reduction over ~124M bf16 values:
// memory-bound, floor = n*sizeof(floatX) / bandwidth.
// Floating-point addition is not associative: the ORDER of the additions changes the bits of
// the result. Training must be reproducible (two runs, same losses), so the production kernel
// fixes the order; atomics do not.
//
// Versions:
//   1  grid-stride partial sums per thread, a block reduction, then ONE atomicAdd per block into
//      the result: fast, but the blocks arrive in a different order on every run, so the last
//      bits change from run to run (reported, not a failure for this version)
//   2  deterministic: each block writes its partial sum to its own slot, then a second kernel
//      (one block) adds the slots in a fixed tree. The grid size is a constant, not derived
//      from the GPU, so the result is the same on every GPU model too
//   3  llmc/cuda/global_norm.cuh (the same two-stage idea, the final sum in double)
// Each version runs 5 times on the same data; versions 2 and 3 must give identical bits.
//
// Tolerance: |err| <= 1e-4 |ref| against the CPU's double-precision sum (fp32 partial sums of
// ~500 values each; fp32 build the same).
// Validation and benchmark on GPT-2 124M's 124,475,904 gradients.
// Small shapes (--small, the emulator's default): n = 1,000,003 (the grids stay as they are:
// about 2 values per thread, some threads one, the grid-stride loop still taken).
//
// ./global_norm [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernel (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/global_norm.h"
}

#define NORM_BLOCKS 1024
#define NORM_THREADS 512

// version 1: block partial sums, atomically added
__global__ void global_norm_v1_kernel(float* out, const floatX* values, size_t n) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = dev_to_float(values[i]);
        s += x * x;
    }
    s = lab_block_sum(s, shared);
    if (threadIdx.x == 0) { atomicAdd(out, s); }
}

// version 2: block partial sums to slots ...
__global__ void global_norm_v2_partial(float* partial, const floatX* values, size_t n) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = dev_to_float(values[i]);
        s += x * x;
    }
    s = lab_block_sum(s, shared);
    if (threadIdx.x == 0) { partial[blockIdx.x] = s; }
}
// ... and one block adds the NORM_BLOCKS slots: each thread a fixed pair of slots, then the tree
__global__ void global_norm_v2_final(float* out, const float* partial) {
    __shared__ float shared[32];
    float s = partial[threadIdx.x] + partial[threadIdx.x + NORM_THREADS];   // NORM_BLOCKS = 2 * NORM_THREADS
    s = lab_block_sum(s, shared);
    if (threadIdx.x == 0) { *out = s; }
}

static float* scratch = NULL;

static void run_version(int version, float* out, const floatX* values, size_t n) {
    switch (version) {
        case 1:
            labCheck(cudaMemsetAsync(out, 0, sizeof(float)));
            global_norm_v1_kernel<<<NORM_BLOCKS, NORM_THREADS>>>(out, values, n);
            LAB_LAUNCH_CHECK();
            break;
        case 2:
            global_norm_v2_partial<<<NORM_BLOCKS, NORM_THREADS>>>(scratch, values, n);
            LAB_LAUNCH_CHECK();
            global_norm_v2_final<<<1, NORM_THREADS>>>(out, scratch);
            LAB_LAUNCH_CHECK();
            break;
        case 3:
            global_norm_squared(out, values, n);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    size_t n = 124475904, big_every = 1000003;
    if (lab_small) { n = 1000003; big_every = 100003; }
    printf("global_norm: n=%zu (%s), validation and benchmark\n", n, lab_small ? "small" : "GPT-2 124M");

    lab_seed(12);
    float* grads = make_random_normal(n, 1e-3f);
    for (size_t i = 0; i < n; i += big_every) { grads[i] = round_to_bf16(0.5f); }   // a few large values
    float ref;
    cpu::global_norm_squared(&ref, grads, n);
    floatX* d_grads = to_device_floatX(grads, n);
    float* d_out = dev_alloc<float>(1);
    scratch = dev_alloc<float>(NORM_BLOCKS);

    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        float results[5];
        for (int r = 0; r < 5; r++) {
            labCheck(cudaMemset(d_out, 0xff, sizeof(float)));
            run_version(v, d_out, d_grads, n);
            labCheck(cudaMemcpy(&results[r], d_out, sizeof(float), cudaMemcpyDeviceToHost));
        }
        int ok = validate_host(&results[0], &ref, 1, "norm^2", 0.0f, 1e-4f);
        int same = 1;
        for (int r = 1; r < 5; r++) { same &= memcmp(&results[r], &results[0], sizeof(float)) == 0; }
        printf("  5 runs %s (first %.9g, last %.9g)\n", same ? "bit-identical" : "DIFFER in the last bits", results[0], results[4]);
        if (v >= 2) { ok &= same; }
        lab_report("global_norm", v, v == 1 ? "(vs llmc/cpu; atomics: determinism not required)" : "(vs llmc/cpu, deterministic)", ok);
        float ms = benchmark_ms(20, [&] { run_version(v, d_out, d_grads, n); });
        print_bench("global_norm", v, ms, (double)n * sizeof(floatX), 0.0, dev);
    }
    free(grads);
    cudaFree(d_grads); cudaFree(d_out); cudaFree(scratch);
    return lab_exit();
}
