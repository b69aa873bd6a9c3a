// Encoder backward, the kernel lab:
//   dwte[inp[b,t], :] += dout[b,t,:]        dwpe[t, :] += sum_b dout[b,t,:]      (both ACCUMULATE)
// The dwte update is a scatter-add: positions holding the same token add into the same row,
// so a thread per position would race. Frequent tokens (spaces, "the") make the collisions
// real. Floor: read dout once, read+write each touched dwte row and all of dwpe once:
// (B*T*C + 2*(distinct tokens)*C + 2*T*C) * sizeof(floatX) / bandwidth.
//
// Versions:
//   1  the CPU's scheme: one thread per channel walks every position in order, adding into
//      fp32 copies of dwte/dwpe (then added into the floatX gradients). No races and
//      deterministic, but only C = 768 threads: a few percent of the GPU is busy
//   2  one thread per (position, channel) with atomicAdd into the fp32 copies: all the
//      parallelism, but float atomics land in a different order on every run (not
//      reproducible), and the full Vp x C fp32 copy has to be cleared and added back
//   3  llmc/cuda/encoder.cuh: the host sorts positions by token (counting sort), then one
//      block per distinct token sums its positions in order: parallel AND deterministic
//
// Tolerance (bf16): |err| <= 1e-2 + 1e-2|ref| (sums of up to ~800 N(0,1) values for the most
// frequent token, fp32 accumulation, one bf16 rounding when added to the initial gradient).
// fp32 build: 1e-4 + 1e-5|ref|. Shape B=8 T=1024 C=768, V=50257 (Vp=50304), skewed token ids.
// Small shapes (--small, the emulator's default): B=3 T=37 C=104 (fewer channels than the 128
// threads of a block in v1 and v3), V=1000 (Vp=1024): tokens 0..99 still repeat.
//
// ./encoder_backward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernel (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/encoder.h"
}

// version 1: one thread per channel, positions in order
__global__ void encoder_backward_v1_kernel(float* acc_wte, float* acc_wpe, const floatX* dout, const int* inp,
                                           int B, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    for (int bt = 0; bt < B * T; bt++) {
        float d = dev_to_float(dout[(size_t)bt * C + c]);
        acc_wte[(size_t)inp[bt] * C + c] += d;
        acc_wpe[(size_t)(bt % T) * C + c] += d;
    }
}

// version 2: one thread per (position, channel), atomics
__global__ void encoder_backward_v2_kernel(float* acc_wte, float* acc_wpe, const floatX* dout, const int* inp,
                                           int B, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) { return; }
    size_t bt = i / C;
    int c = (int)(i % C);
    float d = dev_to_float(dout[i]);
    atomicAdd(&acc_wte[(size_t)inp[bt] * C + c], d);
    atomicAdd(&acc_wpe[(bt % T) * C + c], d);
}

// grad[i] += acc[i] (one rounding to floatX)
__global__ void add_into_kernel(floatX* grad, const float* acc, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) { grad[i] = dev_from_float(dev_to_float(grad[i]) + acc[i]); }
}

static float* acc_wte = NULL;   // fp32 accumulators of versions 1 and 2
static float* acc_wpe = NULL;

static void run_version(int version, floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp, int B, int T, int C,
                        int Vp) {
    size_t nwte = (size_t)Vp * C, nwpe = (size_t)T * C;
    if (version == 3) {
        encoder_backward(dwte, dwpe, dout, inp, B, T, C);
        return;
    }
    labCheck(cudaMemsetAsync(acc_wte, 0, nwte * sizeof(float)));
    labCheck(cudaMemsetAsync(acc_wpe, 0, nwpe * sizeof(float)));
    if (version == 1) {
        encoder_backward_v1_kernel<<<(C + 127) / 128, 128>>>(acc_wte, acc_wpe, dout, inp, B, T, C);
    } else {
        encoder_backward_v2_kernel<<<(unsigned)ceil_div((size_t)B * T * C, 256), 256>>>(acc_wte, acc_wpe, dout, inp, B, T, C);
    }
    LAB_LAUNCH_CHECK();
    add_into_kernel<<<(unsigned)ceil_div(nwte, 256), 256>>>(dwte, acc_wte, nwte);
    LAB_LAUNCH_CHECK();
    add_into_kernel<<<(unsigned)ceil_div(nwpe, 256), 256>>>(dwpe, acc_wpe, nwpe);
    LAB_LAUNCH_CHECK();
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    int B = 8, T = 1024, C = 768, V = 50257, Vp = 50304;
    if (lab_small) { B = 3; T = 37; C = 104; V = 1000; Vp = 1024; }
    size_t BT = (size_t)B * T, nwte = (size_t)Vp * C, nwpe = (size_t)T * C;
    printf("encoder_backward: B=%d T=%d C=%d V=%d (validation and benchmark%s)\n", B, T, C, V, lab_small ? ", small" : "");

    lab_seed(13);
    // skewed token ids: 10% token 0, 40% among 1..99, the rest uniform over the vocabulary
    int* inp = (int*)malloc(BT * sizeof(int));
    for (size_t i = 0; i < BT; i++) {
        uint32_t r = lab_rand_u32() % 10;
        inp[i] = r == 0 ? 0 : (r < 5 ? 1 + (int)(lab_rand_u32() % 99) : (int)(lab_rand_u32() % V));
    }
    std::vector<char> seen(V, 0);
    size_t distinct = 0;
    for (size_t i = 0; i < BT; i++) { if (!seen[inp[i]]) { seen[inp[i]] = 1; distinct++; } }
    float* dout = make_random_normal(BT * C, 1.0f);
    float* dwte0 = make_random_normal(nwte, 1.0f);
    float* dwpe0 = make_random_normal(nwpe, 1.0f);
    float* ref_dwte = host_copy(dwte0, nwte);
    float* ref_dwpe = host_copy(dwpe0, nwpe);
    cpu::encoder_backward(ref_dwte, ref_dwpe, dout, inp, B, T, C);

    floatX* d_dout = to_device_floatX(dout, BT * C);
    int* d_inp = to_device_int(inp, BT);
    floatX* d_dwte = dev_alloc<floatX>(nwte);
    floatX* d_dwpe = dev_alloc<floatX>(nwpe);
    acc_wte = dev_alloc<float>(nwte);
    acc_wpe = dev_alloc<float>(nwpe);

    float atol = LAB_BF16 ? 1e-2f : 1e-4f, rtol = LAB_BF16 ? 1e-2f : 1e-5f;
    double bytes = (double)(BT * C + 2 * distinct * C + 2 * nwpe) * sizeof(floatX);
    printf("  %zu distinct tokens among %zu positions\n", distinct, BT);
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        upload_floatX(d_dwte, dwte0, nwte);
        upload_floatX(d_dwpe, dwpe0, nwpe);
        run_version(v, d_dwte, d_dwpe, d_dout, d_inp, B, T, C, Vp);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_dwte, ref_dwte, nwte, "dwte", atol, rtol);
        ok &= validate_result(d_dwpe, ref_dwpe, nwpe, "dwpe", atol, rtol);
        lab_report("encoder_backward", v, "(dwte, dwpe accumulated, vs llmc/cpu)", ok);
        float ms = benchmark_ms(v == 1 ? 3 : 20, [&] { run_version(v, d_dwte, d_dwpe, d_dout, d_inp, B, T, C, Vp); });
        print_bench("encoder_backward", v, ms, bytes, 0.0, dev);
    }
    free(inp); free(dout); free(dwte0); free(dwpe0); free(ref_dwte); free(ref_dwpe);
    cudaFree(d_dout); cudaFree(d_inp); cudaFree(d_dwte); cudaFree(d_dwpe); cudaFree(acc_wte); cudaFree(acc_wpe);
    return lab_exit();
}
