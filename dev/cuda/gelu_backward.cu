// GELU backward, the kernel lab. Elementwise, with u = k (x + 0.044715 x^3), k = sqrt(2/pi):
//   dinp = dout * ( 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) k (1 + 3*0.044715 x^2) )
// dinp is OVERWRITTEN, and the model runs it in place (dinp == dout): the lab does the same.
// Memory-bound: reads x and dout, writes dinp: floor = 3*N*sizeof(floatX) / bandwidth.
//
// Versions:
//   1  one thread per element
//   2  128-bit vectors: 8 bf16 of x and of dout per thread, one wide load each; in place is
//      safe because each thread reads its whole vector before writing it
//   3  the production kernel, llmc/cuda/gelu.cuh
//
// Tolerance (bf16): |err| <= 5e-3*max|ref| + 1e-2|ref|. fp32 build: 1e-5*max|ref| + 1e-5|ref|.
// Small shapes (--small, the emulator's default): B=3 T=37 C=104, N = B*T*4C + 5 = 46181 (the
// tail of 5 elements, a partial last block).
//
// ./gelu_backward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernels (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/gelu.h"
}

#define LAB_GELU_K 0.7978845608028654f   // sqrt(2/pi)

__device__ inline float lab_gelu_grad(float x) {
    float u = LAB_GELU_K * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float du_dx = LAB_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

// version 1: one thread per element
__global__ void gelu_backward_v1_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N) { dinp[i] = dev_from_float(lab_gelu_grad(dev_to_float(inp[i])) * dev_to_float(dout[i])); }
}

// version 2: 16-byte vectors, plus a scalar tail of N % LAB_PACK elements

__global__ void gelu_backward_v2_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nvec = N / LAB_PACK;
    if (i < nvec) {
        LabPack16 x = reinterpret_cast<const LabPack16*>(inp)[i];
        LabPack16 dy = reinterpret_cast<const LabPack16*>(dout)[i];
        LabPack16 dx;
        for (int k = 0; k < LAB_PACK; k++) { dx.v[k] = dev_from_float(lab_gelu_grad(dev_to_float(x.v[k])) * dev_to_float(dy.v[k])); }
        reinterpret_cast<LabPack16*>(dinp)[i] = dx;
    }
    size_t tail = nvec * LAB_PACK + i;
    if (i < (size_t)LAB_PACK && tail < N) {
        dinp[tail] = dev_from_float(lab_gelu_grad(dev_to_float(inp[tail])) * dev_to_float(dout[tail]));
    }
}

static void run_version(int version, floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    switch (version) {
        case 1:
            gelu_backward_v1_kernel<<<(unsigned)ceil_div(N, 256), 256>>>(dinp, inp, dout, N);
            LAB_LAUNCH_CHECK();
            break;
        case 2:
            gelu_backward_v2_kernel<<<(unsigned)ceil_div(N / LAB_PACK + 1, 256), 256>>>(dinp, inp, dout, N);
            LAB_LAUNCH_CHECK();
            break;
        case 3:
            gelu_backward(dinp, inp, dout, N);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    int B = 8, T = 1024, C = 768;
    if (lab_small) { B = 3; T = 37; C = 104; }
    size_t N = (size_t)B * T * 4 * C + 5;
    printf("gelu_backward: N = B*T*4C + 5 = %zu (B=%d T=%d C=%d), in place (dinp == dout)%s\n", N, B, T, C,
           lab_small ? ", small" : "");

    lab_seed(4);
    float* inp = make_random_normal(N, 2.0f);
    float* dout = make_random_normal(N, 1.0f);
    float* ref = host_alloc(N);
    cpu::gelu_backward(ref, inp, dout, N);
    floatX* d_inp = to_device_floatX(inp, N);
    floatX* d_grad = dev_alloc<floatX>(N);   // holds dout, overwritten with dinp

    float scale = max_abs(ref, N);
    float atol = (LAB_BF16 ? 5e-3f : 1e-5f) * scale, rtol = LAB_BF16 ? 1e-2f : 1e-5f;
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        upload_floatX(d_grad, dout, N);
        run_version(v, d_grad, d_inp, d_grad, N);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_grad, ref, N, "dinp", atol, rtol);
        lab_report("gelu_backward", v, "(in place, vs llmc/cpu)", ok);
        // timed out of place (the same memory traffic), so every repeat sees the same dout
        floatX* d_out = dev_alloc<floatX>(N);
        upload_floatX(d_grad, dout, N);
        float ms = benchmark_ms(50, [&] { run_version(v, d_out, d_inp, d_grad, N); });
        cudaFree(d_out);
        print_bench("gelu_backward", v, ms, 3.0 * N * sizeof(floatX), 0.0, dev);
    }
    free(inp); free(dout); free(ref);
    cudaFree(d_inp); cudaFree(d_grad);
    return lab_exit();
}
