// Encoder forward (token + position embedding), the kernel lab:
//   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
// A gather: pure data movement. Floor = (read wte row + read wpe row + write out) per token
// = 3*B*T*C*sizeof(floatX) / bandwidth (+ the token ids).
//
// Versions:
//   1  one thread per output element (b, t, c), 2-byte loads: simple and coalesced along c
//   2  one thread per 8 channels (16-byte vectors of bf16) for the wte row, the wpe row and
//      out: 8x fewer memory instructions (needs C % 8 == 0, true for every GPT-2 size)
//   3  the production kernel, llmc/cuda/encoder.cuh
//
// Tolerance: out is the bf16 rounding of a sum of two bf16 values: |err| <= 1e-2|ref| + 1e-6
// (fp32 build: 1e-6 + 1e-6|ref|).
// Small shapes (--small, the emulator's default): B=3 T=37 C=104 (13 vectors of 8 bf16), V=1000:
// B*T*C not a multiple of the 256-thread blocks.
//
// ./encoder_forward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernels (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/encoder.h"
}

// version 1: one thread per element
__global__ void encoder_forward_v1_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                          int B, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) { return; }
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    out[i] = dev_from_float(dev_to_float(wte[(size_t)inp[bt] * C + c]) + dev_to_float(wpe[(size_t)t * C + c]));
}

// version 2: one thread per 16-byte vector of channels

__global__ void encoder_forward_v2_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                          int B, int T, int C) {
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * LAB_PACK;   // first element of the vector
    if (i >= (size_t)B * T * C) { return; }
    size_t bt = i / C;
    int c = (int)(i % C), t = (int)(bt % T);
    LabPack16 a = *reinterpret_cast<const LabPack16*>(wte + (size_t)inp[bt] * C + c);
    LabPack16 p = *reinterpret_cast<const LabPack16*>(wpe + (size_t)t * C + c);
    LabPack16 o;
    for (int k = 0; k < LAB_PACK; k++) { o.v[k] = dev_from_float(dev_to_float(a.v[k]) + dev_to_float(p.v[k])); }
    *reinterpret_cast<LabPack16*>(out + i) = o;
}

static void run_version(int version, floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C) {
    size_t N = (size_t)B * T * C;
    switch (version) {
        case 1:
            encoder_forward_v1_kernel<<<(unsigned)ceil_div(N, 256), 256>>>(out, inp, wte, wpe, B, T, C);
            LAB_LAUNCH_CHECK();
            break;
        case 2:
            if (C % LAB_PACK != 0) { die("encoder_forward v2 needs C %% %d == 0", LAB_PACK); }
            encoder_forward_v2_kernel<<<(unsigned)ceil_div(N / LAB_PACK, 256), 256>>>(out, inp, wte, wpe, B, T, C);
            LAB_LAUNCH_CHECK();
            break;
        case 3:
            encoder_forward(out, inp, wte, wpe, B, T, C);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    int B = 8, T = 1024, C = 768, V = 50257, Vp = 50304;
    if (lab_small) { B = 3; T = 37; C = 104; V = 1000; Vp = 1024; }
    size_t N = (size_t)B * T * C;
    printf("encoder_forward: B=%d T=%d C=%d V=%d (validation and benchmark%s)\n", B, T, C, V, lab_small ? ", small" : "");

    lab_seed(5);
    int* inp = make_random_int((size_t)B * T, V);
    float* wte = make_random_normal((size_t)Vp * C, 0.02f);
    float* wpe = make_random_normal((size_t)T * C, 0.01f);
    float* ref = host_alloc(N);
    cpu::encoder_forward(ref, inp, wte, wpe, B, T, C);
    int* d_inp = to_device_int(inp, (size_t)B * T);
    floatX* d_wte = to_device_floatX(wte, (size_t)Vp * C);
    floatX* d_wpe = to_device_floatX(wpe, (size_t)T * C);
    floatX* d_out = dev_alloc<floatX>(N);

    float atol = 1e-6f, rtol = LAB_BF16 ? 1e-2f : 1e-6f;
    double bytes = 3.0 * N * sizeof(floatX) + 4.0 * B * T;
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        labCheck(cudaMemset(d_out, 0xff, N * sizeof(floatX)));
        run_version(v, d_out, d_inp, d_wte, d_wpe, B, T, C);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_out, ref, N, "out", atol, rtol);
        lab_report("encoder_forward", v, "(vs llmc/cpu)", ok);
        float ms = benchmark_ms(50, [&] { run_version(v, d_out, d_inp, d_wte, d_wpe, B, T, C); });
        print_bench("encoder_forward", v, ms, bytes, 0.0, dev);
    }
    free(inp); free(wte); free(wpe); free(ref);
    cudaFree(d_inp); cudaFree(d_wte); cudaFree(d_wpe); cudaFree(d_out);
    return lab_exit();
}
