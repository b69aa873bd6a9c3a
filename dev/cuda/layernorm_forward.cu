// LayerNorm forward, the kernel lab. Over the C channels of each of the N = B*T rows:
//   mean = avg_c x[c],  rstd = 1 / sqrt(avg_c (x[c] - mean)^2 + 1e-5)
//   out[c] = (x[c] - mean) * rstd * w[c] + b[c]          (mean, rstd saved in fp32 for backward)
// Memory-bound: it reads x once and writes out once (2 bytes each in bf16), so the floor is
// (2*N*C*sizeof(floatX) + 8N) / peak bandwidth.
//
// Versions:
//   1  one thread per row: the CPU loop, moved to the GPU. Neighbouring threads read addresses
//      C elements apart, so every load is a separate memory transaction (uncoalesced).
//   2  one warp per row: the 32 lanes read consecutive channels (coalesced), each keeps a
//      partial sum, and warp shuffles add the partials. Two passes over the row (mean, then
//      variance of x - mean, the numerically safe order); the second pass hits the cache.
//   3  the production kernel, llmc/cuda/layernorm.cuh
//
// Tolerances (bf16 build): out |err| <= 1e-2 + 1e-2|ref| (bf16 keeps 8 significant bits:
// 0.4% relative rounding per value); mean, rstd (fp32) |err| <= 1e-5 + 1e-4|ref|.
// Small shapes (--small, the emulator's default): B=3 T=101 C=100: 303 rows (not a multiple of
// the 8 rows of a block), C not a multiple of the 32 lanes.
//
// ./layernorm_forward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernels (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/layernorm.h"
}

// ---------------------------------------------------------------------------------------
// version 1: one thread per row

__global__ void layernorm_forward_v1_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                            const floatX* weight, const floatX* bias, int N, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) { return; }
    const floatX* x = inp + (size_t)i * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) { m += dev_to_float(x[c]); }
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) { float d = dev_to_float(x[c]) - m; v += d * d; }
    float s = rsqrtf(v / C + 1e-5f);
    floatX* o = out + (size_t)i * C;
    for (int c = 0; c < C; c++) {
        o[c] = dev_from_float((dev_to_float(x[c]) - m) * s * dev_to_float(weight[c]) + dev_to_float(bias[c]));
    }
    mean[i] = m;
    rstd[i] = s;
}

// ---------------------------------------------------------------------------------------
// version 2: one warp per row, lanes stride over the channels

__global__ void layernorm_forward_v2_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                            const floatX* weight, const floatX* bias, int N, int C) {
    int warps_per_block = blockDim.x / 32;
    int i = blockIdx.x * warps_per_block + threadIdx.x / 32;   // this warp's row
    int lane = threadIdx.x % 32;
    if (i >= N) { return; }   // the whole warp leaves together: the shuffles below stay full
    const floatX* x = inp + (size_t)i * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) { sum += dev_to_float(x[c]); }
    float m = lab_warp_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = dev_to_float(x[c]) - m; sq += d * d; }
    float s = rsqrtf(lab_warp_sum(sq) / C + 1e-5f);
    floatX* o = out + (size_t)i * C;
    for (int c = lane; c < C; c += 32) {
        o[c] = dev_from_float((dev_to_float(x[c]) - m) * s * dev_to_float(weight[c]) + dev_to_float(bias[c]));
    }
    if (lane == 0) { mean[i] = m; rstd[i] = s; }
}

static void run_version(int version, floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                        const floatX* bias, int B, int T, int C) {
    int N = B * T;
    switch (version) {
        case 1:
            layernorm_forward_v1_kernel<<<(N + 255) / 256, 256>>>(out, mean, rstd, inp, weight, bias, N, C);
            LAB_LAUNCH_CHECK();
            break;
        case 2:
            layernorm_forward_v2_kernel<<<(N + 7) / 8, 256>>>(out, mean, rstd, inp, weight, bias, N, C);
            LAB_LAUNCH_CHECK();
            break;
        case 3:
            layernorm_forward(out, mean, rstd, inp, weight, bias, B, T, C);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    int B = 8, T = 1024, C = 768;
    if (lab_small) { B = 3; T = 101; C = 100; }
    size_t N = (size_t)B * T;
    printf("layernorm_forward: B=%d T=%d C=%d (validation and benchmark%s)\n", B, T, C, lab_small ? ", small" : "");

    lab_seed(1);
    float* inp = make_random_normal(N * C, 1.0f);
    float* weight = make_random_float(C, 0.5f, 1.5f);
    float* bias = make_random_float(C, -0.5f, 0.5f);
    for (size_t i = 0; i < N; i++) {   // give each row its own offset so the mean matters
        float shift = 4.0f * lab_rand_uniform() - 2.0f;
        for (int c = 0; c < C; c++) { inp[i * C + c] += shift; }
    }
    round_to_floatX(inp, N * C);
    float* ref_out = host_alloc(N * C);
    float* ref_mean = host_alloc(N);
    float* ref_rstd = host_alloc(N);
    cpu::layernorm_forward(ref_out, ref_mean, ref_rstd, inp, weight, bias, B, T, C);

    floatX* d_inp = to_device_floatX(inp, N * C);
    floatX* d_weight = to_device_floatX(weight, C);
    floatX* d_bias = to_device_floatX(bias, C);
    floatX* d_out = dev_alloc<floatX>(N * C);
    float* d_mean = dev_alloc<float>(N);
    float* d_rstd = dev_alloc<float>(N);

    float atol = LAB_BF16 ? 1e-2f : 1e-5f, rtol = LAB_BF16 ? 1e-2f : 1e-4f;
    double bytes = 2.0 * N * C * sizeof(floatX) + 2.0 * C * sizeof(floatX) + 8.0 * N;
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        labCheck(cudaMemset(d_out, 0xff, N * C * sizeof(floatX)));   // NaN garbage: unwritten outputs fail
        labCheck(cudaMemset(d_mean, 0xff, N * sizeof(float)));
        labCheck(cudaMemset(d_rstd, 0xff, N * sizeof(float)));
        run_version(v, d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, B, T, C);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_out, ref_out, N * C, "out", atol, rtol);
        ok &= validate_result(d_mean, ref_mean, N, "mean", 1e-5f, 1e-4f);
        ok &= validate_result(d_rstd, ref_rstd, N, "rstd", 1e-5f, 1e-4f);
        lab_report("layernorm_forward", v, "(out, mean, rstd vs llmc/cpu)", ok);
        float ms = benchmark_ms(20, [&] { run_version(v, d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, B, T, C); });
        print_bench("layernorm_forward", v, ms, bytes, 0.0, dev);
    }

    free(inp); free(weight); free(bias); free(ref_out); free(ref_mean); free(ref_rstd);
    cudaFree(d_inp); cudaFree(d_weight); cudaFree(d_bias); cudaFree(d_out); cudaFree(d_mean); cudaFree(d_rstd);
    return lab_exit();
}
