// LayerNorm backward, the kernel lab. Rows i = 0..N-1 (N = B*T), channels c, with
// xhat = (x - mean) * rstd and g = dout * w:
//   dinp[i,c]  += rstd_i * ( g[i,c] - avg_c g[i,:] - xhat[i,c] * avg_c (g[i,:] * xhat[i,:]) )
//   dweight[c] += sum_i dout[i,c] * xhat[i,c]          dbias[c] += sum_i dout[i,c]
// All three ACCUMULATE (+=), as in llmc/cpu/layernorm.h: the test starts them from random
// values. Two different reductions: per row (over c) for dinp, per column (over i) for the
// parameter gradients. The column sums must be deterministic (no float atomics): a fixed
// split into partial sums added in a fixed order.
// Memory-bound: reads dout, inp, dinp and writes dinp: floor = 4*N*C*sizeof(floatX) / bandwidth.
//
// Versions:
//   1  one thread per row for dinp; one thread per channel for dweight/dbias, walking all N
//      rows in order (coalesced across threads, but only C threads: the GPU is mostly idle)
//   2  one warp per row for dinp (shuffle reductions); the column sums in two deterministic
//      stages: 32-channel x 256-row tiles write partial sums, a second kernel adds them in
//      order. Many blocks in flight, and the reduction order never changes.
//   3  the production kernel, llmc/cuda/layernorm.cuh
//
// Tolerances (bf16): dinp |err| <= 1e-2 + 1e-2|ref|; dweight, dbias |err| <= 5e-3*max|ref| +
// 1e-2|ref| (sums of 8192 terms whose bf16 result keeps 0.4% relative precision).
// Small shapes (--small, the emulator's default): B=3 T=101 C=100: 303 rows (two 256-row tiles,
// the second partial; not a multiple of 8 rows per block), C=100: the last 32-channel block
// partial.
//
// ./layernorm_backward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernels (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/layernorm.h"
}

// ---------------------------------------------------------------------------------------
// version 1

__global__ void layernorm_backward_v1_dinp(floatX* dinp, const floatX* dout, const floatX* inp, const floatX* weight,
                                           const float* mean, const float* rstd, int N, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) { return; }
    const floatX* x = inp + (size_t)i * C;
    const floatX* dy = dout + (size_t)i * C;
    float m = mean[i], s = rstd[i];
    float g_mean = 0.0f, gx_mean = 0.0f;
    for (int c = 0; c < C; c++) {
        float g = dev_to_float(dy[c]) * dev_to_float(weight[c]);
        g_mean += g;
        gx_mean += g * (dev_to_float(x[c]) - m) * s;
    }
    g_mean /= C;
    gx_mean /= C;
    floatX* dx = dinp + (size_t)i * C;
    for (int c = 0; c < C; c++) {
        float xhat = (dev_to_float(x[c]) - m) * s;
        float g = dev_to_float(dy[c]) * dev_to_float(weight[c]);
        dx[c] = dev_from_float(dev_to_float(dx[c]) + s * (g - g_mean - xhat * gx_mean));
    }
}

__global__ void layernorm_backward_v1_dweight(floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                                              const float* mean, const float* rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float dw = 0.0f, db = 0.0f;
    for (int i = 0; i < N; i++) {
        float dy = dev_to_float(dout[(size_t)i * C + c]);
        dw += dy * (dev_to_float(inp[(size_t)i * C + c]) - mean[i]) * rstd[i];
        db += dy;
    }
    dweight[c] = dev_from_float(dev_to_float(dweight[c]) + dw);
    dbias[c] = dev_from_float(dev_to_float(dbias[c]) + db);
}

// ---------------------------------------------------------------------------------------
// version 2

__global__ void layernorm_backward_v2_dinp(floatX* dinp, const floatX* dout, const floatX* inp, const floatX* weight,
                                           const float* mean, const float* rstd, int N, int C) {
    int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (i >= N) { return; }
    const floatX* x = inp + (size_t)i * C;
    const floatX* dy = dout + (size_t)i * C;
    float m = mean[i], s = rstd[i];
    float g_sum = 0.0f, gx_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = dev_to_float(dy[c]) * dev_to_float(weight[c]);
        g_sum += g;
        gx_sum += g * (dev_to_float(x[c]) - m) * s;
    }
    float g_mean = lab_warp_sum(g_sum) / C, gx_mean = lab_warp_sum(gx_sum) / C;
    floatX* dx = dinp + (size_t)i * C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (dev_to_float(x[c]) - m) * s;
        float g = dev_to_float(dy[c]) * dev_to_float(weight[c]);
        dx[c] = dev_from_float(dev_to_float(dx[c]) + s * (g - g_mean - xhat * gx_mean));
    }
}

#define LN_ROWS_PER_TILE 256
// Stage 1: block (32, 8) owns channels c0..c0+31 and rows r0..r0+255. Thread (tx, ty) sums
// rows r0+ty, r0+ty+8, ... of channel c0+tx; the 8 partials of a channel are then added in
// shared memory in a fixed order. Output: partial[tile][c] for dweight, then for dbias.
__global__ void layernorm_backward_v2_partial(float* partial, const floatX* dout, const floatX* inp,
                                              const float* mean, const float* rstd, int N, int C) {
    __shared__ float sdw[8][33], sdb[8][33];   // 33: no bank conflicts on the column reads
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    int tile = blockIdx.y, r0 = tile * LN_ROWS_PER_TILE;
    int r1 = min(r0 + LN_ROWS_PER_TILE, N);
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int i = r0 + ty; i < r1; i += 8) {
            float dy = dev_to_float(dout[(size_t)i * C + c]);
            dw += dy * (dev_to_float(inp[(size_t)i * C + c]) - mean[i]) * rstd[i];
            db += dy;
        }
    }
    sdw[ty][tx] = dw;
    sdb[ty][tx] = db;
    __syncthreads();
    if (ty == 0 && c < C) {
        float sw = 0.0f, sb = 0.0f;
        for (int k = 0; k < 8; k++) { sw += sdw[k][tx]; sb += sdb[k][tx]; }
        partial[(size_t)tile * C + c] = sw;
        partial[((size_t)gridDim.y + tile) * C + c] = sb;
    }
}

// Stage 2: one thread per channel adds the tiles' partials in tile order.
__global__ void layernorm_backward_v2_finish(floatX* dweight, floatX* dbias, const float* partial, int ntiles, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float sw = 0.0f, sb = 0.0f;
    for (int t = 0; t < ntiles; t++) { sw += partial[(size_t)t * C + c]; sb += partial[((size_t)ntiles + t) * C + c]; }
    dweight[c] = dev_from_float(dev_to_float(dweight[c]) + sw);
    dbias[c] = dev_from_float(dev_to_float(dbias[c]) + sb);
}

static float* scratch = NULL;   // version 2's partial sums: 2 x ntiles x C floats

static void run_version(int version, floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                        int B, int T, int C) {
    int N = B * T;
    switch (version) {
        case 1:
            layernorm_backward_v1_dinp<<<(N + 255) / 256, 256>>>(dinp, dout, inp, weight, mean, rstd, N, C);
            LAB_LAUNCH_CHECK();
            layernorm_backward_v1_dweight<<<(C + 255) / 256, 256>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
            LAB_LAUNCH_CHECK();
            break;
        case 2: {
            int ntiles = (N + LN_ROWS_PER_TILE - 1) / LN_ROWS_PER_TILE;
            layernorm_backward_v2_dinp<<<(N + 7) / 8, 256>>>(dinp, dout, inp, weight, mean, rstd, N, C);
            LAB_LAUNCH_CHECK();
            layernorm_backward_v2_partial<<<dim3((C + 31) / 32, ntiles), dim3(32, 8)>>>(scratch, dout, inp, mean, rstd, N, C);
            LAB_LAUNCH_CHECK();
            layernorm_backward_v2_finish<<<(C + 255) / 256, 256>>>(dweight, dbias, scratch, ntiles, C);
            LAB_LAUNCH_CHECK();
            break;
        }
        case 3:
            layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C);
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
    printf("layernorm_backward: B=%d T=%d C=%d (validation and benchmark%s)\n", B, T, C, lab_small ? ", small" : "");

    lab_seed(2);
    float* inp = make_random_normal(N * C, 1.0f);
    float* weight = make_random_float(C, 0.5f, 1.5f);
    float* bias = make_random_float(C, -0.5f, 0.5f);
    float* dout = make_random_normal(N * C, 1.0f);
    float* dinp0 = make_random_normal(N * C, 0.5f);   // accumulate on top of these
    float* dweight0 = make_random_normal(C, 10.0f);
    float* dbias0 = make_random_normal(C, 10.0f);
    // the forward's statistics, from the CPU (fp32, as the backend keeps them)
    float* ln_out = host_alloc(N * C);
    float* mean = host_alloc(N);
    float* rstd = host_alloc(N);
    cpu::layernorm_forward(ln_out, mean, rstd, inp, weight, bias, B, T, C);
    float* ref_dinp = host_copy(dinp0, N * C);
    float* ref_dweight = host_copy(dweight0, C);
    float* ref_dbias = host_copy(dbias0, C);
    cpu::layernorm_backward(ref_dinp, ref_dweight, ref_dbias, dout, inp, weight, mean, rstd, B, T, C);

    floatX* d_inp = to_device_floatX(inp, N * C);
    floatX* d_weight = to_device_floatX(weight, C);
    floatX* d_dout = to_device_floatX(dout, N * C);
    float* d_mean = to_device_float(mean, N);
    float* d_rstd = to_device_float(rstd, N);
    floatX* d_dinp = dev_alloc<floatX>(N * C);
    floatX* d_dweight = dev_alloc<floatX>(C);
    floatX* d_dbias = dev_alloc<floatX>(C);
    scratch = dev_alloc<float>(2 * ((N + LN_ROWS_PER_TILE - 1) / LN_ROWS_PER_TILE) * C);

    float atol = LAB_BF16 ? 1e-2f : 1e-4f, rtol = LAB_BF16 ? 1e-2f : 1e-4f;
    float wscale = LAB_BF16 ? 5e-3f : 1e-5f;
    double bytes = 4.0 * N * C * sizeof(floatX) + 8.0 * N;
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        upload_floatX(d_dinp, dinp0, N * C);
        upload_floatX(d_dweight, dweight0, C);
        upload_floatX(d_dbias, dbias0, C);
        run_version(v, d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_mean, d_rstd, B, T, C);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_dinp, ref_dinp, N * C, "dinp", atol, rtol);
        ok &= validate_result(d_dweight, ref_dweight, C, "dweight", wscale * max_abs(ref_dweight, C), rtol);
        ok &= validate_result(d_dbias, ref_dbias, C, "dbias", wscale * max_abs(ref_dbias, C), rtol);
        lab_report("layernorm_backward", v, "(dinp, dweight, dbias accumulated, vs llmc/cpu)", ok);
        // the benchmark keeps accumulating into the same buffers: harmless for timing
        float ms = benchmark_ms(20, [&] {
            run_version(v, d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_mean, d_rstd, B, T, C);
        });
        print_bench("layernorm_backward", v, ms, bytes, 0.0, dev);
    }

    free(inp); free(weight); free(bias); free(dout); free(dinp0); free(dweight0); free(dbias0);
    free(ln_out); free(mean); free(rstd); free(ref_dinp); free(ref_dweight); free(ref_dbias);
    cudaFree(d_inp); cudaFree(d_weight); cudaFree(d_dout); cudaFree(d_mean); cudaFree(d_rstd);
    cudaFree(d_dinp); cudaFree(d_dweight); cudaFree(d_dbias); cudaFree(scratch);
    return lab_exit();
}
