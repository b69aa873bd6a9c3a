// GELU forward, the kernel lab. Elementwise, the tanh approximation GPT-2 uses:
//   gelu(x) = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
// Memory-bound: one read and one write per element, floor = 2*N*sizeof(floatX) / bandwidth.
// (Its FLOPs, ~20 per element, are nothing next to the bandwidth of an H100.)
//
// Versions:
//   1  one thread per element, one 2-byte load and store each: the simplest mapping
//   2  128-bit vectors: each thread loads 8 bf16 (16 bytes) at once with one instruction
//      and stores 8: fewer, wider memory transactions, fewer instructions per byte
//   3  the production kernel, llmc/cuda/gelu.cuh
//
// Tolerance (bf16): |err| <= 5e-3 + 1e-2|ref| (bf16 output rounding; the CPU's tanh via exp
// and the GPU's tanhf agree to ~3e-7). fp32 build: 1e-5 + 1e-5|ref|.
// Small shapes (--small, the emulator's default): B=3 T=37 C=104, N = B*T*4C + 5 = 46181 (the
// tail of 5 elements, a partial last block).
//
// ./gelu_forward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernels (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/gelu.h"
}

#define LAB_GELU_K 0.7978845608028654f   // sqrt(2/pi)

__device__ inline float lab_gelu(float x) {
    float u = LAB_GELU_K * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// version 1: one thread per element
__global__ void gelu_forward_v1_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N) { out[i] = dev_from_float(lab_gelu(dev_to_float(inp[i]))); }
}

// version 2: 16-byte vectors (8 bf16 or 4 fp32 per thread); cudaMalloc pointers are aligned.
// A tail of N % LAB_PACK elements is done one by one by the first threads.

__global__ void gelu_forward_v2_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nvec = N / LAB_PACK;
    if (i < nvec) {
        LabPack16 x = reinterpret_cast<const LabPack16*>(inp)[i];
        LabPack16 y;
        for (int k = 0; k < LAB_PACK; k++) { y.v[k] = dev_from_float(lab_gelu(dev_to_float(x.v[k]))); }
        reinterpret_cast<LabPack16*>(out)[i] = y;
    }
    size_t tail = nvec * LAB_PACK + i;
    if (i < (size_t)LAB_PACK && tail < N) { out[tail] = dev_from_float(lab_gelu(dev_to_float(inp[tail]))); }
}

static void run_version(int version, floatX* out, const floatX* inp, size_t N) {
    switch (version) {
        case 1:
            gelu_forward_v1_kernel<<<(unsigned)ceil_div(N, 256), 256>>>(out, inp, N);
            LAB_LAUNCH_CHECK();
            break;
        case 2:
            gelu_forward_v2_kernel<<<(unsigned)ceil_div(N / LAB_PACK + 1, 256), 256>>>(out, inp, N);
            LAB_LAUNCH_CHECK();
            break;
        case 3:
            gelu_forward(out, inp, N);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    int B = 8, T = 1024, C = 768;
    if (lab_small) { B = 3; T = 37; C = 104; }
    size_t N = (size_t)B * T * 4 * C + 5;   // the MLP's 4C activations; +5 exercises the tail
    printf("gelu_forward: N = B*T*4C + 5 = %zu (B=%d T=%d C=%d), validation and benchmark%s\n", N, B, T, C,
           lab_small ? ", small" : "");

    lab_seed(3);
    float* inp = make_random_normal(N, 2.0f);
    float* ref = host_alloc(N);
    cpu::gelu_forward(ref, inp, N);
    floatX* d_inp = to_device_floatX(inp, N);
    floatX* d_out = dev_alloc<floatX>(N);

    float atol = LAB_BF16 ? 5e-3f : 1e-5f, rtol = LAB_BF16 ? 1e-2f : 1e-5f;
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        labCheck(cudaMemset(d_out, 0xff, N * sizeof(floatX)));
        run_version(v, d_out, d_inp, N);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_out, ref, N, "out", atol, rtol);
        lab_report("gelu_forward", v, "(vs llmc/cpu)", ok);
        float ms = benchmark_ms(50, [&] { run_version(v, d_out, d_inp, N); });
        print_bench("gelu_forward", v, ms, 2.0 * N * sizeof(floatX), 0.0, dev);
    }
    free(inp); free(ref);
    cudaFree(d_inp); cudaFree(d_out);
    return lab_exit();
}
