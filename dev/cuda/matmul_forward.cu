// Matmul forward (a linear layer), the kernel lab:
//   out[bt][o] = bias[o] + sum_c inp[bt][c] * weight[o][c]      inp (BT,C), weight (OC,C), out (BT,OC)
// Compute-bound: 2*BT*C*OC FLOPs against 2*(BT*C + OC*C + BT*OC) bytes; the floor is
// FLOPs / peak dense bf16 tensor FLOP/s (fp32 accumulation). Shape: GPT-2's MLP up-projection
// (C=768 -> OC=3072) at B=8 T=1024 for the benchmark; B=4 T=256 for validation (CPU speed).
//
// Versions:
//   1  naive: a thread per output, the dot product straight from global memory (matmul_lab.cuh)
//   2  shared-memory tiling with 4x4 register blocking, fp32 CUDA cores (matmul_lab.cuh)
//   3  cuBLAS cublasGemmEx: bf16 tensor cores; the bias is pre-filled and added with beta = 1
//   4  llmc/cuda/matmul.cuh: cuBLASLt with the bias fused into the epilogue (what the model runs)
// After the versions: each one's time relative to cuBLAS (v3).
//
// Tolerance (bf16): |err| <= 1e-2 + 1e-2|ref| (out ~ N(0,1); fp32 accumulation over C=768 of the
// same bf16 inputs as the reference, so only the final bf16 rounding, 0.4%, shows). fp32 build:
// 1e-4 + 1e-4|ref|.
// Small shapes (--small, the emulator's default): B=3 T=101 C=72 OC=200 for both: M = BT = 303
// and N = OC = 200 not multiples of the 64-wide tiles, K = C = 72 not a multiple of the 16-deep
// slabs; C and OC multiples of 8 (16-byte rows of bf16, as cuBLAS wants them).
//
// ./matmul_forward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production matmul (the last version)
#include <cublas_v2.h>   // after the backend: cuda_runtime.h first (the emulator's, dev/emu, must come first)
#include "common.h"
#include "matmul_lab.cuh"
namespace cpu {
#include "../../llmc/cpu/matmul.h"
}

// out[bt][o] = bias[o]: the start value for cuBLAS's beta = 1
__global__ void fill_bias_kernel(floatX* out, const floatX* bias, size_t rows, int OC) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < rows * OC) { out[i] = bias[i % OC]; }
}

static void run_version(int version, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                        int B, int T, int C, int OC) {
    int BT = B * T;
    switch (version) {
        case 1:
        case 2:   // Cm = out (BT x OC); A = inp (sam = C, sak = 1); Bm(k=c, n=o) = weight[o*C + c]
            gemm_lab(version, out, inp, weight, bias, BT, OC, C, C, 1, 1, C, OC, 0);
            break;
        case 3:   // column-major: out^T (OC x BT) = (weight as C x OC)^T (inp as C x BT)
            fill_bias_kernel<<<(unsigned)ceil_div((size_t)BT * OC, 256), 256>>>(out, bias, BT, OC);
            LAB_LAUNCH_CHECK();
            lab_cublas_gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, C, weight, C, inp, C, out, OC, 1.0f);
            break;
        case 4:
            matmul_forward(out, inp, weight, bias, B, T, C, OC);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 4;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    int C = 768, OC = 3072;
    int Bv = 4, Tv = 256, Bb = 8, Tb = 1024;
    if (lab_small) { C = 72; OC = 200; Bv = Bb = 3; Tv = Tb = 101; }
    printf("matmul_forward: C=%d OC=%d; validation B=%d T=%d, benchmark B=%d T=%d%s\n", C, OC, Bv, Tv, Bb, Tb,
           lab_small ? " (small)" : "");

    lab_seed(8);
    size_t BTv = (size_t)Bv * Tv, BTb = (size_t)Bb * Tb;
    float* inp = make_random_normal(BTb * C, 1.0f);   // the validation uses the first BTv rows
    float* weight = make_random_normal((size_t)OC * C, 1.0f / sqrtf((float)C));
    float* bias = make_random_normal(OC, 0.5f);
    float* ref = host_alloc(BTv * OC);
    cpu::matmul_forward(ref, inp, weight, bias, Bv, Tv, C, OC);

    floatX* d_inp = to_device_floatX(inp, BTb * C);
    floatX* d_weight = to_device_floatX(weight, (size_t)OC * C);
    floatX* d_bias = to_device_floatX(bias, OC);
    floatX* d_out = dev_alloc<floatX>(BTb * OC);

    float atol = LAB_BF16 ? 1e-2f : 1e-4f, rtol = LAB_BF16 ? 1e-2f : 1e-4f;
    double flops = 2.0 * BTb * C * OC;
    float times[NVERSIONS + 1] = {0};
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        labCheck(cudaMemset(d_out, 0xff, BTb * OC * sizeof(floatX)));
        run_version(v, d_out, d_inp, d_weight, d_bias, Bv, Tv, C, OC);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_out, ref, BTv * OC, "out", atol, rtol);
        lab_report("matmul_forward", v, "(out with bias, vs llmc/cpu)", ok);
        times[v] = benchmark_ms(v == 1 ? 3 : 20, [&] { run_version(v, d_out, d_inp, d_weight, d_bias, Bb, Tb, C, OC); });
        print_bench("matmul_forward", v, times[v], 0.0, flops, dev);
    }
    if (times[3] > 0) {
        for (int v = 1; v <= NVERSIONS; v++) {
            if (times[v] > 0) { printf("  matmul_forward v%d time / cuBLAS time: %.2f\n", v, times[v] / times[3]); }
        }
    }
    free(inp); free(weight); free(bias); free(ref);
    cudaFree(d_inp); cudaFree(d_weight); cudaFree(d_bias); cudaFree(d_out);
    if (lab_cublas) { cublasDestroy(lab_cublas); }
    return lab_exit();
}
