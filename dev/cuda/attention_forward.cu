// Causal multi-head attention forward, the kernel lab. inp (B,T,3C) = q | k | v, NH heads of
// hs = C/NH channels; for each (b, h) and query t:
//   s[t2] = q_t . k_t2 / sqrt(hs)  for t2 <= t,   P[t2] = softmax(s)[t2],   out_t = sum_t2 P[t2] v_t2
// The state saved for the backward differs by version: the materialising versions store P
// (B*NH*T*T floats, as llmc/cpu does); the flash version stores only lse[t] = logsumexp(s)
// (B*NH*T floats), from which the backward recomputes P = exp(s - lse).
// Compute: QK^T and PV over the causal half: 2 * 2*B*NH*(T^2/2)*hs = 2*B*T^2*C FLOPs. The
// floor printed is FLOPs / peak bf16 tensor rate; versions 1-3 use fp32 CUDA cores, so their
// percentage is far below 100; version 4 runs the products on tensor cores.
//
// Versions:
//   1  naive, materialising, three kernels: a thread per score (B*NH*T*T threads), a thread
//      per softmax row, a thread per output element (sums P v over t2). Every q, k, v value is
//      re-read from global memory by thousands of threads.
//   2  materialising, one warp per query row (attention_materialized.cuh): scores, softmax
//      and PV (warp-shuffle reductions, no separate launches, P written once)
//   3  llmc/cuda flash version on CUDA cores (attention_flash.cuh; the fp32 build's and
//      the fallback's kernel): a block owns 64 queries, one per thread; keys and values stream
//      through shared memory in tiles; online softmax keeps a running max and sum, rescaling
//      the partial output when the max grows; no T x T matrix at all.
//   4  llmc/cuda flash version on tensor cores (what the model calls: attention_forward; in
//      the fp32 build it falls back to version 3): 4 warps x 16 queries per block, S = Q K^T
//      and O += P V with mma.sync m16n8k16 (bf16 in, fp32 accumulate), P kept in registers
//      between the two, online softmax in fp32 (llmc/cuda/attention_flash_tc.cuh).
//
// Tolerances: out (bf16) |err| <= 1e-2 + 1e-2|ref|; P (fp32) |err| <= 1e-5 + 1e-3|ref|;
// lse (fp32) |err| <= 1e-4 + 1e-4|ref|. fp32 build: out 1e-4 + 1e-4|ref|.
// Validation at B=4 T=256 (the CPU reference is O(T^2)), benchmark at B=8 T=1024, C=768 NH=12.
// Small shapes (--small, the emulator's default): B=2 T=100 (a full 64-query block and a partial
// one; 32-key tiles: three full, one of 4 keys), validated at every head size of the flash
// kernels: C/NH = 48/3, 64/2, 128/2, 128/1 (hs 16, 32, 64 on tensor cores in v4; hs 128 takes
// v4's fallback to the CUDA-core kernel); benchmark (GPU only) at C=128 NH=2.
//
// ./attention_forward [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernels (versions 3 and 4)
#include "attention_materialized.cuh"      // version 2
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/attention.h"
}

// lse of every causal row, from the inputs (double precision), for checking the flash state
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
// version 1: naive, three kernels

// att[b,h,t,t2] = scaled score (t2 <= t); one thread per (b, h, t, t2)
__global__ void attention_v1_scores(float* att, const floatX* inp, int B, int T, int C, int NH) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * T) { return; }
    int t2 = (int)(idx % T), t = (int)((idx / T) % T);
    int h = (int)((idx / ((size_t)T * T)) % NH), b = (int)(idx / ((size_t)T * T * NH));
    if (t2 > t) { return; }   // the softmax kernel writes the zeros
    int hs = C / NH;
    const floatX* q = inp + ((size_t)b * T + t) * 3 * C + h * hs;
    const floatX* k = inp + ((size_t)b * T + t2) * 3 * C + C + h * hs;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) { s += dev_to_float(q[i]) * dev_to_float(k[i]); }
    att[idx] = s * rsqrtf((float)hs);
}

// softmax over t2 <= t of one row; one thread per (b, h, t)
__global__ void attention_v1_softmax(float* att, int B, int T, int NH) {
    size_t row = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (row >= (size_t)B * NH * T) { return; }
    int t = (int)(row % T);
    float* p = att + row * T;
    float m = -INFINITY;
    for (int t2 = 0; t2 <= t; t2++) { m = fmaxf(m, p[t2]); }
    float sum = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) { p[t2] = expf(p[t2] - m); sum += p[t2]; }
    float inv = 1.0f / sum;
    for (int t2 = 0; t2 < T; t2++) { p[t2] = t2 <= t ? p[t2] * inv : 0.0f; }
}

// out[b,t,c] = sum_t2 P[b,h,t,t2] v[b,t2,c], h = c / hs; one thread per (b, t, c)
__global__ void attention_v1_pv(floatX* out, const float* att, const floatX* inp, int B, int T, int C, int NH) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) { return; }
    int c = (int)(idx % C), t = (int)((idx / C) % T), b = (int)(idx / ((size_t)C * T));
    int h = c / (C / NH);
    const float* p = att + (((size_t)b * NH + h) * T + t) * T;
    float o = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) { o += p[t2] * dev_to_float(inp[((size_t)b * T + t2) * 3 * C + 2 * C + c]); }
    out[idx] = dev_from_float(o);
}

static void run_version(int version, floatX* out, float* state, const floatX* inp, int B, int T, int C, int NH) {
    switch (version) {
        case 1: {
            size_t nscores = (size_t)B * NH * T * T, rows = (size_t)B * NH * T, nout = (size_t)B * T * C;
            attention_v1_scores<<<(unsigned)ceil_div(nscores, 256), 256>>>(state, inp, B, T, C, NH);
            LAB_LAUNCH_CHECK();
            attention_v1_softmax<<<(unsigned)ceil_div(rows, 256), 256>>>(state, B, T, NH);
            LAB_LAUNCH_CHECK();
            attention_v1_pv<<<(unsigned)ceil_div(nout, 256), 256>>>(out, state, inp, B, T, C, NH);
            LAB_LAUNCH_CHECK();
            break;
        }
        case 2:
            attention_forward_materialized(out, state, inp, B, T, C, NH);
            break;
        case 3:
            attention_forward_flash(out, state, inp, B, T, C, NH);   // CUDA-core flash: state = lse
            break;
        case 4:
            attention_forward(out, state, inp, B, T, C, NH);   // the model's call (tensor cores): state = lse
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 4;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    LabAttentionShapes shapes = lab_attention_shapes("attention_forward", lab_small);
    int C = shapes.C, NH = shapes.NH, Bv = shapes.Bv, Tv = shapes.Tv, Bb = shapes.Bb, Tb = shapes.Tb;
    int nconf = shapes.nconf;
    const int *confC = shapes.confC, *confNH = shapes.confNH;
    const char* heads = shapes.heads;

    lab_seed(6);
    float *inp[4], *ref_out[4], *ref_att[4], *ref_lse[4];
    size_t n_inp[4], n_out[4], n_att[4], n_lse[4];
    for (int k = 0; k < nconf; k++) {
        n_inp[k] = (size_t)Bv * Tv * 3 * confC[k];
        n_out[k] = (size_t)Bv * Tv * confC[k];
        n_att[k] = (size_t)Bv * confNH[k] * Tv * Tv;
        n_lse[k] = (size_t)Bv * confNH[k] * Tv;
        inp[k] = make_random_normal(n_inp[k], 1.0f);
        ref_out[k] = host_alloc(n_out[k]);
        ref_att[k] = host_alloc(n_att[k]);
        ref_lse[k] = host_alloc(n_lse[k]);
        cpu::attention_forward(ref_out[k], ref_att[k], inp[k], Bv, Tv, confC[k], confNH[k]);
        host_attention_lse(ref_lse[k], inp[k], Bv, Tv, confC[k], confNH[k]);
    }

    // buffers sized for the benchmark shape (or the largest validation), used at the validation shapes first
    size_t max_inp = (size_t)Bb * Tb * 3 * C, max_out = (size_t)Bb * Tb * C, max_att = (size_t)Bb * NH * Tb * Tb;
    for (int k = 0; k < nconf; k++) {
        max_inp = std::max(max_inp, n_inp[k]); max_out = std::max(max_out, n_out[k]); max_att = std::max(max_att, n_att[k]);
    }
    floatX* d_inp = dev_alloc<floatX>(max_inp);
    floatX* d_out = dev_alloc<floatX>(max_out);
    float* d_state = dev_alloc<float>(max_att);

    float atol = LAB_BF16 ? 1e-2f : 1e-4f, rtol = LAB_BF16 ? 1e-2f : 1e-4f;
    size_t n_bench = (size_t)Bb * Tb * 3 * C;
    float* inp_bench = make_random_normal(n_bench, 1.0f);
    double flops = 2.0 * Bb * (double)Tb * Tb * C;
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        int ok = 1;
        for (int k = 0; k < nconf; k++) {
            if (nconf > 1) { printf("  C=%d NH=%d (hs %d)\n", confC[k], confNH[k], confC[k] / confNH[k]); }
            upload_floatX(d_inp, inp[k], n_inp[k]);
            labCheck(cudaMemset(d_out, 0xff, max_out * sizeof(floatX)));
            labCheck(cudaMemset(d_state, 0xff, max_att * sizeof(float)));
            run_version(v, d_out, d_state, d_inp, Bv, Tv, confC[k], confNH[k]);
            labCheck(cudaDeviceSynchronize());
            ok &= validate_result(d_out, ref_out[k], n_out[k], "out", atol, rtol);
            if (v < 3) { ok &= validate_result(d_state, ref_att[k], n_att[k], "P", 1e-5f, 1e-3f); }
            else { ok &= validate_result(d_state, ref_lse[k], n_lse[k], "lse", 1e-4f, 1e-4f); }
        }
        char what[256];
        snprintf(what, sizeof(what), "(%s%s)", v < 3 ? "out, P vs llmc/cpu" : "out vs llmc/cpu, lse vs host", heads);
        lab_report("attention_forward", v, what, ok);
        upload_floatX(d_inp, inp_bench, n_bench);
        float ms = benchmark_ms(v == 1 ? 3 : 10, [&] { run_version(v, d_out, d_state, d_inp, Bb, Tb, C, NH); });
        print_bench("attention_forward", v, ms, 0.0, flops, dev);
    }
    for (int k = 0; k < nconf; k++) { free(inp[k]); free(ref_out[k]); free(ref_att[k]); free(ref_lse[k]); }
    free(inp_bench);
    cudaFree(d_inp); cudaFree(d_out); cudaFree(d_state);
    return lab_exit();
}
