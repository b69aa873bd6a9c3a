// This GPU's two ceilings for --profile's roofline (llmc/train/profile_report.h), measured at
// start-up in well under a second, each the best of several repetitions timed with CUDA events:
//   compute: the trainer's own matmul (matmul_forward: cuBLASLt in the build's floatX, as the
//            model calls it) on a 4096 x 4096 x 4096 product: the FLOP/s a GPT-2 step can expect
//            of its largest operations, below the data-sheet peak (llmc/cuda/mfu.h) that MFU uses
//   memory:  a device-to-device cudaMemcpy of 512 MiB, each byte counted twice (read and written)
// The model and its activations are already allocated: both shrink to fit in a quarter of the
// memory still free. Under the CPU emulator (dev/emu) the same code runs on tiny sizes, and the
// figures (the emulator's speed, not a GPU's) say so.
#pragma once

#include "common.cuh"
#include "memory.cuh"   // device_malloc
#include "matmul.cuh"   // matmul_forward

// values in [-1, 1): tensor cores are not timed on zeros (a GPU may run them at a higher clock)
__global__ void ceilings_fill_kernel(floatX* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned int h = (unsigned int)i * 2654435761u;
        p[i] = from_float((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

// the best time of `reps` runs of work() (after one untimed run: cuBLASLt's plan, the pages mapped),
// each between two events on the stream the kernels run on
template <typename Work>
static inline double ceilings_best_seconds(int reps, Work work) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    float best = 1e30f;
    for (int rep = 0; rep <= reps; rep++) {
        cudaCheck(cudaEventRecord(start, 0));
        work();
        cudaCheck(cudaEventRecord(stop, 0));
        cudaCheck(cudaEventSynchronize(stop));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        if (rep > 0 && ms < best) { best = ms; }
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return best > 0.0f ? 1e-3 * best : 1e-9;   // (a clock too coarse for the emulator's tiny sizes)
}

static inline void backend_measure_ceilings(double* flops_per_s, double* bytes_per_s, char* how, size_t how_size) {
    backend_ensure_init();
#ifdef LLMC_EMU
    int n = 64;                           // the emulator: 0.5 MFLOP and 2 MiB moved, a few ms
    size_t copy_bytes = (size_t)1 << 20;
    const int reps = 3;
    const char* emulated = "the CPU emulator's speed, not a GPU's: ";
#else
    int n = 4096;
    size_t copy_bytes = (size_t)512 << 20;
    const int reps = 10;
    const char* emulated = "";
#endif
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    while (n > 256 && 3 * (size_t)n * n * sizeof(floatX) > free_b / 4) { n /= 2; }
    while (copy_bytes > ((size_t)16 << 20) && 2 * copy_bytes > free_b / 4) { copy_bytes /= 2; }

    // compute: out (n, n) = a (n, n) w^T
    size_t nn = (size_t)n * n;
    floatX* a = (floatX*)device_malloc(3 * nn * sizeof(floatX));
    floatX *w = a + nn, *out = w + nn;
    ceilings_fill_kernel<<<grid_for(2 * nn, 256), 256>>>(a, 2 * nn);
    cudaCheckLaunch();
    *flops_per_s = 2.0 * n * nn / ceilings_best_seconds(reps, [&] { matmul_forward(out, a, w, NULL, 1, n, n, n); });
    device_free(a);

    // memory: src -> dst
    char* src = (char*)device_malloc(2 * copy_bytes);
    char* dst = src + copy_bytes;
    cudaCheck(cudaMemset(src, 1, copy_bytes));
    *bytes_per_s = 2.0 * (double)copy_bytes /
                   ceilings_best_seconds(reps, [&] { cudaCheck(cudaMemcpy(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
    device_free(src);
    snprintf(how, how_size, "%smatmul_forward (cuBLASLt, %s) %dx%dx%d; cudaMemcpy of %zu MiB on the device, read + written; best of %d",
             emulated, FLOATX_IS_BF16 ? "bf16" : "fp32", n, n, n, copy_bytes >> 20, reps);
}
