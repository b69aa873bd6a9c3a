// Matmul backward (a linear layer), the kernel lab. With inp (BT,C), weight (OC,C), dout (BT,OC):
//   dinp[bt][c]    = sum_o  dout[bt][o] * weight[o][c]     OVERWRITES     (BT x C,  K = OC)
//   dweight[o][c] += sum_bt dout[bt][o] * inp[bt][c]       accumulates    (OC x C,  K = BT)
//   dbias[o]      += sum_bt dout[bt][o]                    accumulates, deterministically
// Compute-bound: 4*BT*C*OC FLOPs (two GEMMs); the floor is FLOPs / peak bf16 tensor FLOP/s.
// Shape: GPT-2's MLP up-projection (C=768, OC=3072); benchmark B=8 T=1024, validation B=4 T=256.
//
// Versions:
//   1  naive GEMM kernel for both products (matmul_lab.cuh); dbias: a thread per column
//      walking all BT rows
//   2  tiled GEMM kernel (shared memory, 4x4 register blocks); dbias in two deterministic
//      stages (32-column x 256-row tiles of partial sums, then a fixed-order sum)
//   3  cuBLAS cublasGemmEx for both products (beta = 1 accumulates dweight); dbias as in v2
//   4  llmc/cuda/matmul.cuh: cuBLASLt (what the model runs)
// After the versions: each one's time relative to cuBLAS (v3).
//
// Tolerances (bf16): dinp, dweight, dbias |err| <= 5e-3*max|ref| + 1e-2|ref| (fp32 sums of
// up to 3072 terms rounded once to bf16). fp32 build: 1e-5*max|ref| + 1e-4|ref|.
// Small shapes (--small, the emulator's default): B=3 T=101 C=72 OC=200 for both: BT = 303 rows
// (two 256-row dbias tiles, the second partial; dweight's K = 303 not a multiple of 16), OC = 200
// not a multiple of the 64-wide tiles nor of 32 columns; C and OC multiples of 8 (cuBLAS).
//
// ./matmul_backward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production matmul (the last version)
#include <cublas_v2.h>   // after the backend: cuda_runtime.h first (the emulator's, dev/emu, must come first)
#include "common.h"
#include "matmul_lab.cuh"
namespace cpu {
#include "../../llmc/cpu/matmul.h"
}

// dbias, naive: a thread per column o, rows in order
__global__ void bias_backward_v1_kernel(floatX* dbias, const floatX* dout, int BT, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) { return; }
    float s = 0.0f;
    for (int r = 0; r < BT; r++) { s += dev_to_float(dout[(size_t)r * OC + o]); }
    dbias[o] = dev_from_float(dev_to_float(dbias[o]) + s);
}

// dbias, two stages: block (32, 8) sums a 32-column x 256-row tile into partial[tile][o] ...
#define BIAS_TILE_ROWS 256
__global__ void bias_backward_v2_partial(float* partial, const floatX* dout, int BT, int OC) {
    __shared__ float s[8][33];
    int o = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * BIAS_TILE_ROWS, r1 = min(r0 + BIAS_TILE_ROWS, BT);
    float acc = 0.0f;
    if (o < OC) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) { acc += dev_to_float(dout[(size_t)r * OC + o]); }
    }
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        for (int y = 1; y < 8; y++) { acc += s[y][threadIdx.x]; }
        partial[(size_t)blockIdx.y * OC + o] = acc;
    }
}
// ... then a thread per column adds the tiles in order
__global__ void bias_backward_v2_finish(floatX* dbias, const float* partial, int ntiles, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) { return; }
    float s = 0.0f;
    for (int t = 0; t < ntiles; t++) { s += partial[(size_t)t * OC + o]; }
    dbias[o] = dev_from_float(dev_to_float(dbias[o]) + s);
}

static float* scratch = NULL;   // dbias partial sums

static void bias_backward_v2(floatX* dbias, const floatX* dout, int BT, int OC) {
    int ntiles = (BT + BIAS_TILE_ROWS - 1) / BIAS_TILE_ROWS;
    bias_backward_v2_partial<<<dim3((OC + 31) / 32, ntiles), dim3(32, 8)>>>(scratch, dout, BT, OC);
    LAB_LAUNCH_CHECK();
    bias_backward_v2_finish<<<(OC + 255) / 256, 256>>>(dbias, scratch, ntiles, OC);
    LAB_LAUNCH_CHECK();
}

static void run_version(int version, floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                        const floatX* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    switch (version) {
        case 1:
        case 2:
            // dinp (BT x C) = dout (BT x OC; sam = OC, sak = 1) . weight (OC x C; sbk = C, sbn = 1)
            gemm_lab(version, dinp, dout, weight, NULL, BT, C, OC, OC, 1, C, 1, C, 0);
            // dweight (OC x C) += dout^T (A(o, bt) = dout[bt*OC + o]; sam = 1, sak = OC) . inp (sbk = C, sbn = 1)
            gemm_lab(version, dweight, dout, inp, NULL, OC, C, BT, 1, OC, C, 1, C, 1);
            if (version == 1) {
                bias_backward_v1_kernel<<<(OC + 255) / 256, 256>>>(dbias, dout, BT, OC);
                LAB_LAUNCH_CHECK();
            } else {
                bias_backward_v2(dbias, dout, BT, OC);
            }
            break;
        case 3:
            // column-major: dinp^T (C x BT) = (weight as C x OC) (dout as OC x BT)
            lab_cublas_gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, BT, OC, weight, C, dout, OC, dinp, C, 0.0f);
            // dweight^T (C x OC) += (inp as C x BT) (dout as OC x BT)^T
            lab_cublas_gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, BT, inp, C, dout, OC, dweight, C, 1.0f);
            bias_backward_v2(dbias, dout, BT, OC);
            break;
        case 4:
            matmul_backward(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
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
    printf("matmul_backward: C=%d OC=%d; validation B=%d T=%d, benchmark B=%d T=%d%s\n", C, OC, Bv, Tv, Bb, Tb,
           lab_small ? " (small)" : "");

    lab_seed(9);
    size_t BTv = (size_t)Bv * Tv, BTb = (size_t)Bb * Tb;
    float* inp = make_random_normal(BTb * C, 1.0f);     // validation: the first BTv rows
    float* dout = make_random_normal(BTb * OC, 1.0f);
    float* weight = make_random_normal((size_t)OC * C, 1.0f / sqrtf((float)C));
    float* dweight0 = make_random_normal((size_t)OC * C, 10.0f);   // accumulated on top of these
    float* dbias0 = make_random_normal(OC, 10.0f);
    float* ref_dinp = host_alloc(BTv * C);
    float* ref_dweight = host_copy(dweight0, (size_t)OC * C);
    float* ref_dbias = host_copy(dbias0, OC);
    cpu::matmul_backward(ref_dinp, ref_dweight, ref_dbias, dout, inp, weight, Bv, Tv, C, OC);

    floatX* d_inp = to_device_floatX(inp, BTb * C);
    floatX* d_dout = to_device_floatX(dout, BTb * OC);
    floatX* d_weight = to_device_floatX(weight, (size_t)OC * C);
    floatX* d_dinp = dev_alloc<floatX>(BTb * C);
    floatX* d_dweight = dev_alloc<floatX>((size_t)OC * C);
    floatX* d_dbias = dev_alloc<floatX>(OC);
    scratch = dev_alloc<float>(ceil_div(BTb, BIAS_TILE_ROWS) * OC);

    float rel = LAB_BF16 ? 5e-3f : 1e-5f, rtol = LAB_BF16 ? 1e-2f : 1e-4f;
    double flops = 4.0 * BTb * C * OC;
    float times[NVERSIONS + 1] = {0};
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        labCheck(cudaMemset(d_dinp, 0xff, BTb * C * sizeof(floatX)));
        upload_floatX(d_dweight, dweight0, (size_t)OC * C);
        upload_floatX(d_dbias, dbias0, OC);
        run_version(v, d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, Bv, Tv, C, OC);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_dinp, ref_dinp, BTv * C, "dinp", rel * max_abs(ref_dinp, BTv * C), rtol);
        ok &= validate_result(d_dweight, ref_dweight, (size_t)OC * C, "dweight", rel * max_abs(ref_dweight, (size_t)OC * C), rtol);
        ok &= validate_result(d_dbias, ref_dbias, OC, "dbias", rel * max_abs(ref_dbias, OC), rtol);
        lab_report("matmul_backward", v, "(dinp, dweight and dbias accumulated, vs llmc/cpu)", ok);
        times[v] = benchmark_ms(v == 1 ? 3 : 20, [&] {
            run_version(v, d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, Bb, Tb, C, OC);
        });
        print_bench("matmul_backward", v, times[v], 0.0, flops, dev);
    }
    if (times[3] > 0) {
        for (int v = 1; v <= NVERSIONS; v++) {
            if (times[v] > 0) { printf("  matmul_backward v%d time / cuBLAS time: %.2f\n", v, times[v] / times[3]); }
        }
    }
    free(inp); free(dout); free(weight); free(dweight0); free(dbias0); free(ref_dinp); free(ref_dweight); free(ref_dbias);
    cudaFree(d_inp); cudaFree(d_dout); cudaFree(d_weight); cudaFree(d_dinp); cudaFree(d_dweight); cudaFree(d_dbias);
    cudaFree(scratch);
    if (lab_cublas) { cublasDestroy(lab_cublas); }
    return lab_exit();
}
