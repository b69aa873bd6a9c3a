// Causal multi-head attention backward, the kernel lab. Per (b, h), with P the softmax
// probabilities (P[t][t2] = 0 for t2 > t), dO = dout, scale = 1/sqrt(hs):
//   dV = P^T dO     dP = dO V^T     dS = P * (dP - rowsum(P * dP))     dQ = scale dS K     dK = scale dS^T Q
// (rowsum(P * dP)[t] = dO_t . O_t, which is how the flash version gets it without P.)
// dinp (B,T,3C) = dq | dk | dv is OVERWRITTEN. The state from the forward differs by version:
// P itself (B*NH*T*T floats) for the materialising versions, lse (B*NH*T) for flash.
// Compute: four T x T x hs products over the causal half: 4*B*T^2*C FLOPs (the flash versions
// recompute the scores and the forward for dO.O, ~1.5x more, not counted). The floor is
// FLOPs / peak bf16 tensor rate; versions 1-3 run on fp32 CUDA cores, 4 on tensor cores.
//
// Versions (no float atomics anywhere: every output element is summed by one thread, in order):
//   1  naive, materialising: a thread per row of dS (dP = dO.v, rowsum, dS), then a thread per
//      element of dinp summing over keys (dq) or over queries (dk, dv)
//   2  materialising (attention_materialized.cuh): the same split, with a warp per row of dS
//   3  llmc/cuda flash version on CUDA cores (attention_flash.cuh; the fp32 build's and
//      the fallback's kernel): P recomputed from lse tile by tile in shared memory; D = dO.O
//      by a re-run of the forward; one kernel for dK,dV (a thread per key), one for dQ (a
//      thread per query)
//   4  llmc/cuda flash version on tensor cores (what the model calls: attention_backward; in
//      the fp32 build it falls back to version 3): the same three passes with every product
//      on mma.sync m16n8k16 (bf16 in, fp32 accumulate); dK,dV: a block owns 64 keys (16 per
//      warp) and loops over query tiles; dQ: a block owns 64 queries and loops over key tiles
//
// Tolerances (bf16): dinp |err| <= 5e-3*max|ref| + 1e-2|ref| (fp32 build: 1e-5*max|ref| + 1e-4|ref|).
// Validation at B=4 T=256 against llmc/cpu, with the state computed on the host (P by the CPU
// forward, lse in double), so the backward is checked on its own; benchmark at B=8 T=1024.
// Small shapes (--small, the emulator's default): B=2 T=100 (a full 64-row block and a partial
// one; 32-row tiles: three full, one of 4 rows), validated at every head size of the flash
// kernels: C/NH = 48/3, 64/2, 128/2, 128/1 (hs 16, 32, 64 on tensor cores in v4; hs 128 takes
// v4's fallback to the CUDA-core kernels); benchmark (GPU only) at C=128 NH=2.
//
// ./attention_backward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernels (versions 3 and 4)
#include "attention_materialized.cuh"      // version 2
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/attention.h"
}

static void host_attention_lse(float* lse, const float* inp, int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* q = inp + ((size_t)b * T + t) * 3 * C + h * hs;
                std::vector<double> s(t + 1);
                double m = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = inp + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++) { d += (double)q[i] * k[i]; }
                    s[t2] = d * scale;
                    m = s[t2] > m ? s[t2] : m;
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) { sum += exp(s[t2] - m); }
                lse[((size_t)b * NH + h) * T + t] = (float)(m + log(sum));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// version 1

// dS row (b, h, t): dP[t2] = dO_t . v_t2, then dS = P (dP - sum_t2 P dP); one thread per row
__global__ void attention_v1_ds(float* dS, const floatX* dout, const floatX* inp, const float* att,
                                int B, int T, int C, int NH) {
    size_t row = blockIdx.x * (size_t)blockDim.x + threadIdx.x;   // (b * NH + h) * T + t
    if (row >= (size_t)B * NH * T) { return; }
    int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    const floatX* dO = dout + ((size_t)b * T + t) * C + h * hs;
    const float* p = att + row * T;
    float* ds = dS + row * T;
    float rowdot = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        const floatX* v = inp + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
        float dp = 0.0f;
        for (int i = 0; i < hs; i++) { dp += dev_to_float(dO[i]) * dev_to_float(v[i]); }
        ds[t2] = dp;
        rowdot += p[t2] * dp;
    }
    for (int t2 = 0; t2 <= t; t2++) { ds[t2] = p[t2] * (ds[t2] - rowdot); }
}

// one thread per (b, t, c): dq_t = scale sum_{t2<=t} dS[t][t2] k_t2;  for key position t:
// dk_t = scale sum_{tq>=t} dS[tq][t] q_tq,  dv_t = sum_{tq>=t} P[tq][t] dO_tq
__global__ void attention_v1_dinp(floatX* dinp, const float* dS, const floatX* dout, const floatX* inp,
                                  const float* att, int B, int T, int C, int NH) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) { return; }
    int c = (int)(idx % C), t = (int)((idx / C) % T), b = (int)(idx / ((size_t)C * T));
    int hs = C / NH, h = c / hs;
    float scale = rsqrtf((float)hs);
    const float* dS_head = dS + ((size_t)b * NH + h) * T * T;
    const float* P_head = att + ((size_t)b * NH + h) * T * T;
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) { dq += dS_head[(size_t)t * T + t2] * dev_to_float(inp[((size_t)b * T + t2) * 3 * C + C + c]); }
    for (int tq = t; tq < T; tq++) {
        dk += dS_head[(size_t)tq * T + t] * dev_to_float(inp[((size_t)b * T + tq) * 3 * C + c]);
        dv += P_head[(size_t)tq * T + t] * dev_to_float(dout[((size_t)b * T + tq) * C + c]);
    }
    floatX* d = dinp + ((size_t)b * T + t) * 3 * C;
    d[c] = dev_from_float(dq * scale);
    d[C + c] = dev_from_float(dk * scale);
    d[2 * C + c] = dev_from_float(dv);
}

static float* scratch_dS = NULL;   // version 1: B*NH*T*T floats

static void run_version(int version, floatX* dinp, const floatX* dout, const floatX* inp, const float* state,
                        int B, int T, int C, int NH) {
    switch (version) {
        case 1: {
            size_t rows = (size_t)B * NH * T, n = (size_t)B * T * C;
            attention_v1_ds<<<(unsigned)ceil_div(rows, 128), 128>>>(scratch_dS, dout, inp, state, B, T, C, NH);
            LAB_LAUNCH_CHECK();
            attention_v1_dinp<<<(unsigned)ceil_div(n, 256), 256>>>(dinp, scratch_dS, dout, inp, state, B, T, C, NH);
            LAB_LAUNCH_CHECK();
            break;
        }
        case 2:
            attention_backward_materialized(dinp, dout, inp, state, B, T, C, NH);
            break;
        case 3:
            attention_backward_flash(dinp, dout, inp, state, B, T, C, NH);   // CUDA-core flash: state = lse
            break;
        case 4:
            attention_backward(dinp, dout, inp, state, B, T, C, NH);   // the model's call (tensor cores): state = lse
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 4;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    LabAttentionShapes shapes = lab_attention_shapes("attention_backward", lab_small);
    int C = shapes.C, NH = shapes.NH, Bv = shapes.Bv, Tv = shapes.Tv, Bb = shapes.Bb, Tb = shapes.Tb;
    int nconf = shapes.nconf;
    const int *confC = shapes.confC, *confNH = shapes.confNH;
    const char* heads = shapes.heads;

    lab_seed(7);
    float *inp[4], *dout[4], *att[4], *lse[4], *ref_dinp[4];
    size_t n_inp[4], n_out[4], n_att[4], n_lse[4];
    for (int k = 0; k < nconf; k++) {
        n_inp[k] = (size_t)Bv * Tv * 3 * confC[k];
        n_out[k] = (size_t)Bv * Tv * confC[k];
        n_att[k] = (size_t)Bv * confNH[k] * Tv * Tv;
        n_lse[k] = (size_t)Bv * confNH[k] * Tv;
        inp[k] = make_random_normal(n_inp[k], 1.0f);
        dout[k] = make_random_normal(n_out[k], 1.0f);
        float* out = host_alloc(n_out[k]);
        att[k] = host_alloc(n_att[k]);
        lse[k] = host_alloc(n_lse[k]);
        ref_dinp[k] = host_alloc(n_inp[k]);
        cpu::attention_forward(out, att[k], inp[k], Bv, Tv, confC[k], confNH[k]);
        host_attention_lse(lse[k], inp[k], Bv, Tv, confC[k], confNH[k]);
        cpu::attention_backward(ref_dinp[k], dout[k], inp[k], att[k], Bv, Tv, confC[k], confNH[k]);
        free(out);
    }

    size_t max_inp = (size_t)Bb * Tb * 3 * C, max_out = (size_t)Bb * Tb * C, max_att = (size_t)Bb * NH * Tb * Tb;
    for (int k = 0; k < nconf; k++) {
        max_inp = std::max(max_inp, n_inp[k]); max_out = std::max(max_out, n_out[k]); max_att = std::max(max_att, n_att[k]);
    }
    floatX* d_inp = dev_alloc<floatX>(max_inp);
    floatX* d_dout = dev_alloc<floatX>(max_out);
    floatX* d_dinp = dev_alloc<floatX>(max_inp);
    float* d_state = dev_alloc<float>(max_att);
    scratch_dS = dev_alloc<float>(max_att);
    // benchmark inputs at the full shape (their state comes from the production forward below)
    size_t nb_inp = (size_t)Bb * Tb * 3 * C, nb_out = (size_t)Bb * Tb * C;
    float* inp_bench = make_random_normal(nb_inp, 1.0f);
    float* dout_bench = make_random_normal(nb_out, 1.0f);

    float rtol = LAB_BF16 ? 1e-2f : 1e-4f;
    double flops = 4.0 * Bb * (double)Tb * Tb * C;
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        int ok = 1;
        for (int k = 0; k < nconf; k++) {
            if (nconf > 1) { printf("  C=%d NH=%d (hs %d)\n", confC[k], confNH[k], confC[k] / confNH[k]); }
            upload_floatX(d_inp, inp[k], n_inp[k]);
            upload_floatX(d_dout, dout[k], n_out[k]);
            if (v < 3) { labCheck(cudaMemcpy(d_state, att[k], n_att[k] * sizeof(float), cudaMemcpyHostToDevice)); }
            else { labCheck(cudaMemcpy(d_state, lse[k], n_lse[k] * sizeof(float), cudaMemcpyHostToDevice)); }
            labCheck(cudaMemset(d_dinp, 0xff, max_inp * sizeof(floatX)));
            run_version(v, d_dinp, d_dout, d_inp, d_state, Bv, Tv, confC[k], confNH[k]);
            labCheck(cudaDeviceSynchronize());
            float atol = (LAB_BF16 ? 5e-3f : 1e-5f) * max_abs(ref_dinp[k], n_inp[k]);
            ok &= validate_result(d_dinp, ref_dinp[k], n_inp[k], "dinp", atol, rtol);
        }
        char what[256];
        snprintf(what, sizeof(what), "(dq, dk, dv from %s, vs llmc/cpu%s)", v < 3 ? "P" : "lse", heads);
        lab_report("attention_backward", v, what, ok);
        // benchmark: a consistent state for the full shape from the production forward
        // (not under the emulator, which times nothing)
        if (!LAB_EMULATED) {
            upload_floatX(d_inp, inp_bench, nb_inp);
            upload_floatX(d_dout, dout_bench, nb_out);
            if (v < 3) { attention_forward_materialized(d_dinp, d_state, d_inp, Bb, Tb, C, NH); }
            else if (v == 3) { attention_forward_flash(d_dinp, d_state, d_inp, Bb, Tb, C, NH); }
            else { attention_forward(d_dinp, d_state, d_inp, Bb, Tb, C, NH); }
            labCheck(cudaDeviceSynchronize());
        }
        float ms = benchmark_ms(v == 1 ? 3 : 10, [&] { run_version(v, d_dinp, d_dout, d_inp, d_state, Bb, Tb, C, NH); });
        print_bench("attention_backward", v, ms, 0.0, flops, dev);
    }
    for (int k = 0; k < nconf; k++) { free(inp[k]); free(dout[k]); free(att[k]); free(lse[k]); free(ref_dinp[k]); }
    free(inp_bench); free(dout_bench);
    cudaFree(d_inp); cudaFree(d_dout); cudaFree(d_dinp); cudaFree(d_state); cudaFree(scratch_dS);
    return lab_exit();
}
