// AdamW update, the kernel lab. With g = grad * grad_scale (the clipping factor) and step t:
//   m = b1 m + (1-b1) g     v = b2 v + (1-b2) g^2     mhat = m/(1-b1^t)     vhat = v/(1-b2^t)
//   p = p - lr * ( mhat / (sqrt(vhat) + eps) + wd * p )
// bf16 build: p is the fp32 MASTER copy; the bf16 parameter the model uses is written as p
// rounded to bf16. Round-to-nearest loses every update smaller than half a bf16 spacing
// (2^-9 relative: lr * update below ~0.2% of the weight is simply dropped); STOCHASTIC rounding
// rounds up with probability (p - lower)/(upper - lower), so the expected parameter is p and
// small updates accumulate on average.
// Memory-bound: per parameter it reads master, grad, m, v and writes master, m, v, param:
// 4+2+4+4 + 4+4+4+2 = 28 bytes in bf16 (fp32 build: 24, no master): floor = bytes / bandwidth.
//
// Versions:
//   1  one thread per parameter, round-to-nearest to bf16 (correct on a single step, biased
//      over many: small updates vanish)
//   2  one thread per parameter, stochastic rounding with random bits from a hash of
//      (seed, index): deterministic for a given seed, no RNG state to store
//   3  llmc/cuda/adamw.cuh (grid-stride loop, the same stochastic rounding idea)
//
// Tolerances: master, m, v (fp32) |err| <= 1e-7 + 1e-5|ref|; the bf16 parameter must be one of
// the two bf16 neighbours of the reference master value: |err| <= 2^-7 |ref| (one bf16 spacing).
// fp32 build (no master: parameters updated in place): 1e-7 + 1e-5|ref|.
// Validation on 16M+3 parameters; benchmark on GPT-2 124M's 124,475,904.
// Small shapes (--small, the emulator's default): 3*65536+3 = 196611 parameters for both (a
// partial last block).
//
// ./adamw [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernel (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/adamw.h"
}

__device__ inline float lab_adamw_step(float p, float g, float* m, float* v, size_t i, float lr, float beta1, float beta2,
                                       float bc1, float bc2, float eps, float wd) {
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    return p - lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
}

// version 1: round to nearest
__global__ void adamw_v1_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                                float lr, float beta1, float beta2, float bc1, float bc2, float eps, float wd,
                                float grad_scale) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float p = master ? master[i] : dev_to_float(params[i]);
    p = lab_adamw_step(p, dev_to_float(grads[i]) * grad_scale, m, v, i, lr, beta1, beta2, bc1, bc2, eps, wd);
    if (master) { master[i] = p; }
    params[i] = dev_from_float(p);
}

// version 2: stochastic rounding. A bf16 is the top 16 bits of an fp32: adding a uniform random
// 16-bit number to the low half before truncating carries into the kept bits with probability
// (low half) / 2^16, i.e. rounds the magnitude up with probability proportional to the distance.
__device__ inline uint32_t lab_hash(uint32_t x) {   // integer mixing (a "lowbias32" style hash)
    x ^= x >> 16; x *= 0x21f0aaadu;
    x ^= x >> 15; x *= 0x735a2d97u;
    x ^= x >> 15;
    return x;
}
__device__ inline void lab_store_stochastic(float* dst, float p, uint32_t r) { (void)r; *dst = p; }
__device__ inline void lab_store_stochastic(__nv_bfloat16* dst, float p, uint32_t r) {
    uint32_t bits = __float_as_uint(p);
    if ((bits & 0x7f800000u) != 0x7f800000u) { bits += r & 0xffffu; }   // inf/NaN: plain truncation
    *dst = __ushort_as_bfloat16((unsigned short)(bits >> 16));
}

__global__ void adamw_v2_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                                float lr, float beta1, float beta2, float bc1, float bc2, float eps, float wd,
                                float grad_scale, uint32_t seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float p = master ? master[i] : dev_to_float(params[i]);
    p = lab_adamw_step(p, dev_to_float(grads[i]) * grad_scale, m, v, i, lr, beta1, beta2, bc1, bc2, eps, wd);
    if (master) { master[i] = p; }
    lab_store_stochastic(params + i, p, lab_hash((uint32_t)i ^ lab_hash(seed + (uint32_t)(i >> 32))));
}

typedef struct { float lr, beta1, beta2, eps, wd, grad_scale; int t; uint32_t seed; } AdamHyper;

static void run_version(int version, floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                        const AdamHyper& h) {
    float bc1 = 1.0f - powf(h.beta1, (float)h.t), bc2 = 1.0f - powf(h.beta2, (float)h.t);   // as the CPU does
    unsigned grid = (unsigned)ceil_div(n, 256);
    switch (version) {
        case 1:
            adamw_v1_kernel<<<grid, 256>>>(params, master, grads, m, v, n, h.lr, h.beta1, h.beta2, bc1, bc2, h.eps, h.wd,
                                           h.grad_scale);
            LAB_LAUNCH_CHECK();
            break;
        case 2:
            adamw_v2_kernel<<<grid, 256>>>(params, master, grads, m, v, n, h.lr, h.beta1, h.beta2, bc1, bc2, h.eps, h.wd,
                                           h.grad_scale, h.seed);
            LAB_LAUNCH_CHECK();
            break;
        case 3:
            adamw_update(params, master, grads, m, v, n, h.lr, h.beta1, h.beta2, h.eps, h.wd, h.t, h.grad_scale, h.seed);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    size_t nv = ((size_t)1 << 24) + 3, nb = 124475904;
    if (lab_small) { nv = nb = 3 * (size_t)65536 + 3; }
    printf("adamw: validation n=%zu, benchmark n=%zu (%s), %s\n", nv, nb, lab_small ? "small" : "GPT-2 124M",
           LAB_BF16 ? "fp32 master weights -> bf16 parameters" : "fp32 parameters in place");
    AdamHyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 5, 12345u};

    lab_seed(11);
    float* master0 = make_random_normal(nv, 0.05f);
    if (LAB_BF16) {   // a master copy carries bits below bf16: give it some
        for (size_t i = 0; i < nv; i++) { master0[i] += 1e-4f * (lab_rand_uniform() - 0.5f) * master0[i]; }
    }
    float* grads = make_random_normal(nv, 1e-2f);
    float* m0 = make_random_normal(nv, 1e-3f);
    float* v0 = make_random_float(nv, 0.0f, 1e-4f);
    float* ref_p = host_copy(master0, nv);
    float* ref_m = host_copy(m0, nv);
    float* ref_v = host_copy(v0, nv);
    cpu::adamw_update(ref_p, NULL, grads, ref_m, ref_v, nv, h.lr, h.beta1, h.beta2, h.eps, h.wd, h.t, h.grad_scale, h.seed);

    floatX* d_params = dev_alloc<floatX>(nb);
    float* d_master = LAB_BF16 ? dev_alloc<float>(nb) : NULL;
    floatX* d_grads = dev_alloc<floatX>(nb);
    float* d_m = dev_alloc<float>(nb);
    float* d_v = dev_alloc<float>(nb);
    // zeros beyond the validation's nv elements: the benchmark runs on finite numbers
    labCheck(cudaMemset(d_params, 0, nb * sizeof(floatX)));
    if (d_master) { labCheck(cudaMemset(d_master, 0, nb * sizeof(float))); }
    labCheck(cudaMemset(d_grads, 0, nb * sizeof(floatX)));
    labCheck(cudaMemset(d_m, 0, nb * sizeof(float)));
    labCheck(cudaMemset(d_v, 0, nb * sizeof(float)));
    upload_floatX(d_grads, grads, nv);

    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        upload_floatX(d_params, master0, nv);   // the parameters are the master rounded to floatX
        if (d_master) { labCheck(cudaMemcpy(d_master, master0, nv * sizeof(float), cudaMemcpyHostToDevice)); }
        labCheck(cudaMemcpy(d_m, m0, nv * sizeof(float), cudaMemcpyHostToDevice));
        labCheck(cudaMemcpy(d_v, v0, nv * sizeof(float), cudaMemcpyHostToDevice));
        run_version(v, d_params, d_master, d_grads, d_m, d_v, nv, h);
        labCheck(cudaDeviceSynchronize());
        int ok = validate_result(d_m, ref_m, nv, "m", 1e-7f, 1e-5f);
        ok &= validate_result(d_v, ref_v, nv, "v", 1e-7f, 1e-5f);
        if (d_master) {
            ok &= validate_result(d_master, ref_p, nv, "master", 1e-7f, 1e-5f);
            ok &= validate_result(d_params, ref_p, nv, "params", 0.0f, 1.0f / 128.0f);
            // how the rounding error averages out: mean (param - master) in units of mean |master| * 2^-8
            float* p = host_alloc(nv);
            download(p, d_params, nv);
            double err = 0.0, mag = 0.0;
            for (size_t i = 0; i < nv; i++) { err += (double)p[i] - ref_p[i]; mag += fabs(ref_p[i]); }
            printf("  mean rounding error %.3e (%.4f bf16 spacings): %s\n", err / nv, err / (mag / 256.0),
                   v == 1 ? "round to nearest" : "stochastic");
            free(p);
        } else {
            ok &= validate_result(d_params, ref_p, nv, "params", 1e-7f, 1e-5f);
        }
        lab_report("adamw", v, "(m, v, master, params vs llmc/cpu)", ok);
        float ms = benchmark_ms(20, [&] { run_version(v, d_params, d_master, d_grads, d_m, d_v, nb, h); });
        print_bench("adamw", v, ms, (LAB_BF16 ? 28.0 : 24.0) * nb, 0.0, dev);
    }
    free(master0); free(grads); free(m0); free(v0); free(ref_p); free(ref_m); free(ref_v);
    cudaFree(d_params); if (d_master) { cudaFree(d_master); } cudaFree(d_grads); cudaFree(d_m); cudaFree(d_v);
    return lab_exit();
}
