// Fused classifier (softmax + cross-entropy + logit gradient, with loss weights), the kernel lab.
// For each row i of the B*T rows of logits (Vp columns, the first V real), w_i the loss weight:
//   loss_i   = w_i * ( logsumexp(x_i[0:V]) - x_i[target_i] )
//   dlogit_i = dloss * w_i * ( softmax(x_i) - onehot(target_i) ),  0 in the padded columns V..Vp-1
// written OVER the logits (the probabilities are never stored: a B*T*Vp buffer saved).
// Memory-bound: at best one read and one write of the logits, floor = 2*B*T*Vp*sizeof(floatX)
// / bandwidth (a version that reads the row twice moves 3/2 of that).
//
// Versions:
//   1  one thread per row: max, sum of exp, then the gradient, three passes over 50257 columns;
//      neighbouring threads read addresses Vp apart (uncoalesced) and only B*T threads exist
//   2  one block per row, three passes: block max, block sum of exp, gradient; the threads
//      read consecutive columns (coalesced), shared-memory reductions in a fixed tree
//   3  llmc/cuda/classifier.cuh: one block per row with an ONLINE softmax (running max and sum
//      rescaled as the max grows), so the max and the sum come out of a single read pass
//
// Tolerances: losses (fp32) |err| <= 1e-3 + 1e-4|ref|; dlogits (bf16) |err| <= 1e-3*dloss +
// 1e-2|ref| (0.1% of the largest possible gradient, dloss*|w|, plus bf16 rounding).
// fp32 build: dlogits 1e-5*dloss + 1e-4|ref|.
// Validation B=2 T=1024 (the CPU does 2048 rows of 50257 exps), benchmark B=8 T=1024; V=50257.
// Small shapes (--small, the emulator's default): B=2 T=37, two vocabularies: V=1500 (Vp=1536:
// several columns per thread) and V=300 (Vp=384: threads and whole warps without a column).
//
// ./classifier [version] [--small]
#include "../../llmc/cuda/backend.cuh"   // the production kernel (the last version)
#include "common.h"
namespace cpu {
#include "../../llmc/cpu/classifier.h"
}

// version 1: one thread per row
__global__ void classifier_v1_kernel(floatX* logits, float* losses, const float* weights, const int* targets, float dloss,
                                     int N, int V, int Vp) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) { return; }
    floatX* x = logits + (size_t)i * Vp;
    float m = -INFINITY;
    for (int v = 0; v < V; v++) { m = fmaxf(m, dev_to_float(x[v])); }
    float sum = 0.0f;
    for (int v = 0; v < V; v++) { sum += expf(dev_to_float(x[v]) - m); }
    float lse = m + logf(sum);
    float w = weights ? weights[i] : 1.0f;
    int target = targets[i];
    losses[i] = w * (lse - dev_to_float(x[target]));
    float scale = dloss * w;
    for (int v = 0; v < Vp; v++) {
        float d = v < V ? scale * (expf(dev_to_float(x[v]) - lse) - (v == target ? 1.0f : 0.0f)) : 0.0f;
        x[v] = dev_from_float(d);
    }
}

// version 2: one block per row, three coalesced passes
__global__ void classifier_v2_kernel(floatX* logits, float* losses, const float* weights, const int* targets, float dloss,
                                     int V, int Vp) {
    __shared__ float shared[32];
    size_t i = blockIdx.x;
    floatX* x = logits + i * Vp;
    int target = targets[i];
    float target_logit = dev_to_float(x[target]);   // every thread reads it before anyone writes
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) { m = fmaxf(m, dev_to_float(x[v])); }
    m = lab_block_max(m, shared);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) { s += expf(dev_to_float(x[v]) - m); }
    s = lab_block_sum(s, shared);   // its internal __syncthreads also orders the reads above before the writes below
    float lse = m + logf(s);
    float w = weights ? weights[i] : 1.0f;
    if (threadIdx.x == 0) { losses[i] = w * (lse - target_logit); }
    float scale = dloss * w;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float d = v < V ? scale * (expf(dev_to_float(x[v]) - lse) - (v == target ? 1.0f : 0.0f)) : 0.0f;
        x[v] = dev_from_float(d);
    }
}

static void run_version(int version, floatX* logits, float* losses, const float* weights, const int* targets, float dloss,
                        int B, int T, int V, int Vp) {
    int N = B * T;
    switch (version) {
        case 1:
            classifier_v1_kernel<<<(N + 127) / 128, 128>>>(logits, losses, weights, targets, dloss, N, V, Vp);
            LAB_LAUNCH_CHECK();
            break;
        case 2:
            classifier_v2_kernel<<<N, 512>>>(logits, losses, weights, targets, dloss, V, Vp);
            LAB_LAUNCH_CHECK();
            break;
        case 3:
            fused_classifier(logits, losses, weights, targets, dloss, B, T, V, Vp, 1);
            break;
    }
}

int main(int argc, char** argv) {
    const int NVERSIONS = 3;
    int selected = lab_parse_version(argc, argv, NVERSIONS);
    DeviceInfo dev = lab_device_init();
    int V = 50257, Vp = 50304;   // the benchmark's (and the validation's at full size)
    int Bv = 2, Tv = 1024, Bb = 8, Tb = 1024;
    // the vocabularies validated: GPT-2's; small: V=1500 (2-3 columns per thread of a 512-thread
    // block: the online rescaling within a thread) and V=300 (lanes 300-319 and warps 10-15
    // without any column: the -inf paths of the combination; padding columns 300-383)
    int nconf = 1, confV[2] = {V, 0}, confVp[2] = {Vp, 0};
    if (lab_small) {
        V = confV[0] = 1500; Vp = confVp[0] = 1536;
        confV[1] = 300; confVp[1] = 384;
        nconf = 2;
        Bv = Bb = 2; Tv = Tb = 37;
    }
    printf("classifier: V=%d Vp=%d; validation B=%d T=%d, benchmark B=%d T=%d\n", V, Vp, Bv, Tv, Bb, Tb);
    if (nconf > 1) { printf("  small: validation also at V=%d Vp=%d\n", confV[1], confVp[1]); }

    lab_seed(10);
    size_t Nv = (size_t)Bv * Tv, Nb = (size_t)Bb * Tb;
    float *logits[2], *ref_dlogits[2], *ref_losses[2];
    int *targets[2], *d_targets[2];
    logits[0] = make_random_normal(Nv * Vp, 2.0f);
    targets[0] = make_random_int(Nb, V);
    float* weights = host_alloc(Nb);   // 1 (half), 0 (a quarter: masked), signed in [-1, 1) (a quarter: RL-style)
    for (size_t i = 0; i < Nb; i++) {
        uint32_t r = lab_rand_u32() % 4;
        weights[i] = r < 2 ? 1.0f : (r == 2 ? 0.0f : 2.0f * lab_rand_uniform() - 1.0f);
    }
    for (int k = 1; k < nconf; k++) {
        logits[k] = make_random_normal(Nv * confVp[k], 2.0f);
        targets[k] = make_random_int(Nv, confV[k]);
    }
    float dloss = 1.0f / (float)Nv;
    size_t max_logits = Nb * Vp;
    for (int k = 0; k < nconf; k++) {
        ref_dlogits[k] = host_copy(logits[k], Nv * confVp[k]);
        ref_losses[k] = host_alloc(Nv);
        cpu::fused_classifier(ref_dlogits[k], ref_losses[k], weights, targets[k], dloss, Bv, Tv, confV[k], confVp[k], 1);
        d_targets[k] = to_device_int(targets[k], k == 0 ? Nb : Nv);
        max_logits = std::max(max_logits, Nv * confVp[k]);
    }

    floatX* d_logits = dev_alloc<floatX>(max_logits);
    float* d_losses = dev_alloc<float>(Nb);
    float* d_weights = to_device_float(weights, Nb);
    float* bench_logits = make_random_normal(Nb * Vp, 2.0f);

    float atol = (LAB_BF16 ? 1e-3f : 1e-5f) * dloss, rtol = LAB_BF16 ? 1e-2f : 1e-4f;
    double bytes = 2.0 * Nb * Vp * sizeof(floatX);
    for (int v = 1; v <= NVERSIONS; v++) {
        if (!lab_selected(selected, v)) { continue; }
        printf("version %d\n", v);
        int ok = 1;
        for (int k = 0; k < nconf; k++) {
            if (nconf > 1) { printf("  V=%d Vp=%d\n", confV[k], confVp[k]); }
            upload_floatX(d_logits, logits[k], Nv * confVp[k]);
            labCheck(cudaMemset(d_losses, 0xff, Nb * sizeof(float)));
            run_version(v, d_logits, d_losses, d_weights, d_targets[k], dloss, Bv, Tv, confV[k], confVp[k]);
            labCheck(cudaDeviceSynchronize());
            ok &= validate_result(d_losses, ref_losses[k], Nv, "losses", 1e-3f, 1e-4f);
            ok &= validate_result(d_logits, ref_dlogits[k], Nv * confVp[k], "dlogits", atol, rtol);
        }
        lab_report("classifier", v, nconf > 1 ? "(losses and dlogits with loss weights, vs llmc/cpu; V 1500 and 300)"
                                              : "(losses and dlogits with loss weights, vs llmc/cpu)", ok);
        // the benchmark overwrites the logits with gradients; later repeats run on those (finite) values
        upload_floatX(d_logits, bench_logits, Nb * Vp);
        float ms = benchmark_ms(v == 1 ? 3 : 20, [&] {
            run_version(v, d_logits, d_losses, d_weights, d_targets[0], 1.0f / Nb, Bb, Tb, V, Vp);
        });
        print_bench("classifier", v, ms, bytes, 0.0, dev);
    }
    for (int k = 0; k < nconf; k++) { free(logits[k]); free(targets[k]); free(ref_dlogits[k]); free(ref_losses[k]); cudaFree(d_targets[k]); }
    free(weights); free(bench_logits);
    cudaFree(d_logits); cudaFree(d_losses); cudaFree(d_weights);
    return lab_exit();
}
