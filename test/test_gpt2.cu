// The model against PyTorch (test/reference/gpt2.py), in three stages:
//   test_gpt2 --write-inputs DIR   a small random model (our init) and two batches:
//                                  batch.bin (pre-training loss), batch_masked.bin (0/1 loss mask)
//   python3 test/reference/gpt2.py --model DIR/model.bin --batch DIR/batch.bin --out DIR/ref.bin
//   test_gpt2 --check DIR          our logits, loss, every gradient, 10 AdamW steps and the final
//                                  parameters against the reference; exits 1 on any miss
// Mixture of experts: four more models, each with its own reference (moe_*.bin, the
// same batch): (a) E 4, k 2, every block MoE, capacity factor 0.5, so that tokens are dropped
// (both sides must drop some, and the same number); (b) E 4, k 1 (Switch), every 2nd of 4
// blocks, capacity 2, nothing dropped; (c) E 8, k 2, every 2nd of 4 blocks, capacity 1.25;
// (d) E 4, k 1, capacity 1.1 (ceil(8.8) = 9: the rounding up matters), expert 2's router row a
// copy of expert 1's, so their probabilities are equal for every token and the tie rule (the
// lower index) decides each routing where they lead. The loss compared is the cross-entropy +
// the auxiliary loss (compared on its own too, 1e-5); the gradients include the router's and
// the experts'. Case (a) also runs the masked batch. Only in the fp32 builds (CPU, CUDA with
// PRECISION=FP32): in bf16, near-tie routing decisions flip (see main).
// A third stage checks the RLVR loss (llmc/tasks/rlvr_rollouts.h): for fixed prompts, sampled completions,
// rewards and a frozen reference model (rl_*.bin), the policy-gradient + KL loss and its
// gradients against test/reference/rlvr.py, which computes the advantages and the loss from
// their definitions and differentiates with autograd.
// test_gpt2cpu --check DIR --precision bf16: the CPU backend storing every floatX tensor in bf16
// (llmc/cpu/memory.h) against the bf16 reference (gpt2.py --dtype bfloat16 -> ref_bf16.bin,
// ref_bf16_masked.bin: bf16 storage, fp32 math in each kernel, fp32 master weights), the dense
// cases, with tolerances tighter than the CUDA bf16 build's (tolerances_bf16_simulation); the RLVR cases
// against their fp32 reference as the CUDA bf16 build does; the MoE cases not (see main).
// Measured errors: doc/precision-tests.md.
// Tolerances (fp32): logits and gradients within 1e-4 of each tensor's largest magnitude; the
// loss within 1e-5 relative; each of the step losses and gradient norms within 1e-4 relative;
// the parameters after the steps on the update, not element-wise (compare_update says why: Adam
// gives noise-sized gradients lr-sized steps): the elements whose update the gradient tolerance
// leaves undetermined left out (at most 10% of a tensor), the rest norm-wise within 1e-3 (the CPU:
// 1e-4) and, along
// the update and along the weight decay's term, within 1e-4 and 1e-2 (compare_update_fp32; a
// norm-wise 1e-4 over every element until an H200 run failed it with gradients within tolerance).
//
// Built by nvcc (test_gpt2cu, the CUDA backend): the fp32 build (PRECISION=FP32, matmuls
// without TF32) is held to the same fp32 tolerances; the bf16 build to the bf16 ones in
// tolerances_for_build() below, each ~2-3x the error measured under the CUDA emulator
// (dev/emu; doc/cuda-backend.md has the figures). The bf16 build also checks that its bf16
// parameters are its fp32 master weights rounded (within one bf16 ulp). test_gpt2cu --check also runs
// a determinism check: two 6-step runs give bit-identical losses and parameters, and a run
// saved at step 3 (checkpoint + optimizer state, test/optimizer_state.h), reloaded into a fresh model
// and continued to step 6 matches the uninterrupted run bit for bit.
#include <vector>
#include "../llmc/common.h"
#include "../llmc/model/gpt2.h"
#include "../llmc/model/checkpoint.h"
#include "optimizer_state.h"
#include "../llmc/tasks/rlvr_rollouts.h"

// ---- tolerances: logits and gradients max |ours - ref| / max |ref| per tensor; relative
// errors for the scalars; the parameters after the AdamW steps norm-wise on the update
// (compare_update below says why)
typedef struct {
    float logits, loss, rl_loss, step_loss, step_norm;
    float grads[NUM_PARAMETER_TENSORS];    // in the parameter table's order
    float update[NUM_PARAMETER_TENSORS];   // |(w - w0) - (r - r0)|_2 / |r - r0|_2 (fp32: over the elements kept)
    // fp32 only (update_fp32 = 1; compare_update_fp32 says why): an element is left out of the
    // update's comparison when its sensitivity (update_sensitivity) exceeds update_left_lr x lr; at most
    // update_left_cap of a tensor's elements may be; the kept elements' update error projected on
    // the update (scale) and on the weight decay's term (decay) within update_scale, update_decay
    int update_fp32;
    float update_left_lr, update_left_cap, update_scale, update_decay;
} Tolerances;

// prec: the run's storage format (backend_precision()): PREC_FP32 for the CPU and the CUDA
// PRECISION=FP32 build, PREC_BF16 for the CUDA bf16 build and the CPU with --precision bf16
static Tolerances tolerances_for(int prec) {
    Tolerances t;
    if (prec != PREC_FP32 && prec != PREC_BF16) {
        die("no reference tolerances for --precision %s (fp32 and bf16 only)", precision_name(prec));
    }
    if (prec == PREC_FP32) {
        // fp32 (the CPU, and the CUDA build with PRECISION=FP32). Measured under the CUDA emulator
        // (fp32 build, doc/cuda-backend.md): logits 2.0e-7, loss 1.2e-7, RL loss 2.0e-7, gradients
        // <= 6.4e-7, step losses 1.1e-7, norms 1.8e-7, updates <= 8.6e-6 (LN gains), <= 6.1e-6 others.
        // The updates: compare_update_fp32 (why these numbers: there). A single norm-wise 1e-4 over
        // every element failed on an H200 (fcw 1.3e-4, fcprojw 1.7e-4, doc/gpu-results.md) with
        // every gradient within its tolerance.
        t.logits = 1e-4f; t.loss = 1e-5f; t.rl_loss = 1e-4f; t.step_loss = 1e-4f; t.step_norm = 1e-4f;
        // the kept elements' norm: 1e-4 for the CPU (as before the H200 run: its own errors are
        // <= 5.5e-6 on the reference suite's inputs, 4.5e-5 on the bundle's; deterministic; the
        // reference suite keeps at least the old sensitivity),
        // 1e-3 for the CUDA fp32 build (a GPU's summation order: noise of the H200's size reaches
        // 4.2e-4 on the kept elements, compare_update_fp32)
#ifdef LLMC_CPU
        const float norm_tol = 1e-4f;
#else
        const float norm_tol = 1e-3f;
#endif
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { t.grads[i] = 1e-4f; t.update[i] = norm_tol; }
        t.update_fp32 = 1;
        t.update_left_lr = 1.0f; t.update_left_cap = 0.1f; t.update_scale = 1e-4f; t.update_decay = 1e-2f;
        return t;
    }
    // bf16: the CUDA bf16 build against the fp32 reference; the CPU's --precision bf16 against the
    // bf16 reference (gpt2.py --dtype bfloat16) is held to the same (its errors:
    // doc/precision-tests.md). Measured under the CUDA emulator (bf16 build, every case of
    // --check; the table is in doc/cuda-backend.md), each tolerance ~2-3x the largest measured error:
    //   logits 3.8e-3 -> 1e-2; loss 9.5e-6 -> 3e-5; RL loss 2.3e-4 (GRPO + KL: a sum of terms of
    //   both signs, -0.59, so its relative error is larger) -> 7e-4; step losses 2.9e-4 -> 8e-4;
    //   gradient norms 3.4e-3 -> 1e-2; gradients 4.6e-3 .. 8.7e-3 of each tensor's max -> 2e-2.
    // They replace first estimates from bf16's 8-bit mantissa that were 3-170x looser (logits
    // 3e-2, loss 5e-3, step losses 1e-2, norms 5e-2, gradients 5e-2). Unconfirmed on a GPU.
    t.logits = 1e-2f; t.loss = 3e-5f; t.rl_loss = 7e-4f; t.step_loss = 8e-4f; t.step_norm = 1e-2f;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { t.grads[i] = 2e-2f; }
    t.update_fp32 = 0;
    t.update_left_lr = t.update_left_cap = t.update_scale = t.update_decay = NAN;
    // the update after 10 AdamW steps, norm-wise: measured <= 2.6e-2 for every tensor but the
    // LayerNorm gains, which reach 5.1e-2 (ln1w: their gradients are the smallest and change
    // sign between steps, so more of their elements are noise-dominated) -> 7.5e-2 and 0.15
    // (the five MoE tensors take the dense MLP's figure; not measured)
    //                    wte    wpe    ln1w   ln1b   qkvw   qkvb   attprojw attprojb
    float u[21] = {7.5e-2f, 7.5e-2f, 0.15f, 7.5e-2f, 7.5e-2f, 7.5e-2f, 7.5e-2f, 7.5e-2f,
    //                    ln2w   ln2b   fcw    fcb    fcprojw fcprojb lnfw   lnfb
                   0.15f, 7.5e-2f, 7.5e-2f, 7.5e-2f, 7.5e-2f, 7.5e-2f, 0.15f, 7.5e-2f,
    //                    routerw expfcw expfcb expfcprojw expfcprojb
                   7.5e-2f, 7.5e-2f, 7.5e-2f, 7.5e-2f, 7.5e-2f};
    static_assert(NUM_PARAMETER_TENSORS == 21, "one update tolerance per parameter tensor");
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { t.update[i] = u[i]; }
    return t;
}
static Tolerances tolerances_for_build() { return tolerances_for(backend_precision()); }
// The CPU's --precision bf16 against the bf16 reference (both sides round at the same places):
// tighter than the CUDA build's bf16-against-fp32 table, which a CPU that did not round at all
// would also pass. Each ~2.5-3x the largest error measured (doc/precision-tests.md): logits 3.3e-3
// (one bf16 ulp: the floor of any bf16-vs-bf16 comparison) -> 1e-2; loss 4.4e-6 -> 1.5e-5;
// gradients <= 6.1e-3 -> 2e-2; step losses 9.2e-5 -> 3e-4; norms 1.1e-3 -> 3e-3; updates <= 1.3e-2
// (every tensor, LayerNorm gains included) -> 3e-2.
static Tolerances tolerances_bf16_simulation() {
    Tolerances t = tolerances_for(PREC_BF16);
    t.loss = 1.5e-5f; t.step_loss = 3e-4f; t.step_norm = 3e-3f;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { t.update[i] = 3e-2f; }
    return t;
}

#define BATCH_MAGIC 20241121
#define REF_MAGIC 20241122

typedef struct {
    int B, T, steps, has_weights;
    float lr, beta1, beta2, eps, weight_decay, clip;
    std::vector<int> inputs, targets;
    std::vector<float> weights;
} RefBatch;

static void write_batch(const char* path, const RefBatch& b) {
    int header[256] = {0};
    header[0] = BATCH_MAGIC; header[1] = 1; header[2] = b.B; header[3] = b.T; header[4] = b.steps;
    header[5] = b.has_weights;
    float hp[6] = {b.lr, b.beta1, b.beta2, b.eps, b.weight_decay, b.clip};
    memcpy(&header[8], hp, sizeof(hp));   // floats stored bit for bit in header slots 8..13
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    fwrite_or_die(header, sizeof(int), 256, f, path);
    fwrite_or_die(b.inputs.data(), sizeof(int), b.inputs.size(), f, path);
    fwrite_or_die(b.targets.data(), sizeof(int), b.targets.size(), f, path);
    if (b.has_weights) { fwrite_or_die(b.weights.data(), sizeof(float), b.weights.size(), f, path); }
    fclose_and_rename(f, tmp, path);
}

static RefBatch read_batch(const char* path) {
    FILE* f = fopen_or_die(path, "rb");
    int header[256];
    fread_or_die(header, sizeof(int), 256, f, path);
    if (header[0] != BATCH_MAGIC || header[1] != 1) { die("'%s' is not a reference batch file", path); }
    RefBatch b;
    b.B = header[2]; b.T = header[3]; b.steps = header[4]; b.has_weights = header[5];
    float hp[6];
    memcpy(hp, &header[8], sizeof(hp));
    b.lr = hp[0]; b.beta1 = hp[1]; b.beta2 = hp[2]; b.eps = hp[3]; b.weight_decay = hp[4]; b.clip = hp[5];
    size_t n = (size_t)b.B * b.T;
    b.inputs.resize(n); b.targets.resize(n);
    fread_or_die(b.inputs.data(), sizeof(int), n, f, path);
    fread_or_die(b.targets.data(), sizeof(int), n, f, path);
    if (b.has_weights) { b.weights.resize(n); fread_or_die(b.weights.data(), sizeof(float), n, f, path); }
    fclose(f);
    return b;
}

// ---- RLVR cases: rows of (prompt, completion) tokens, their rewards, the advantage mode
// and the KL coefficient. Header: [magic, version, rows, G, mode, beta bits]; then per row
// (prompt length, completion length, tokens...); then the rewards.
#define RL_CASE_MAGIC 20241124
#define RL_REF_MAGIC 20241125

typedef struct {
    int G, mode;
    float beta;
    std::vector<std::vector<int>> prompts, completions;
    std::vector<float> rewards;
} RLCase;

static void write_rl_case(const char* path, int mode, float beta, uint64_t seed) {
    RLCase c;
    c.mode = mode;
    c.beta = beta;
    c.G = mode == RL_TOP1 ? 1 : 3;
    int rows = 9;
    // rewards: groups with mixed rewards, and (grpo) one group where every sample scored 1,
    // which must give zero advantages (no NaN)
    float grpo_rewards[9] = {1, 0, 0, 1, 1, 0, 1, 1, 1};
    float top1_rewards[9] = {1, 0, 1, 1, 0, 0, 1, 0, 1};
    Rng rng;
    rng_init(&rng, seed);
    for (int i = 0; i < rows; i++) {
        int plen = 3 + (int)(rng_u32(&rng) % 5), clen = 1 + (int)(rng_u32(&rng) % 6);
        std::vector<int> pr(1, 256), co;   // prompts start with end-of-text, as in the data
        for (int t = 1; t < plen; t++) { pr.push_back((int)(rng_u32(&rng) % 256)); }
        for (int t = 0; t < clen; t++) { co.push_back((int)(rng_u32(&rng) % 257)); }
        c.prompts.push_back(pr);
        c.completions.push_back(co);
        c.rewards.push_back(mode == RL_TOP1 ? top1_rewards[i] : grpo_rewards[i]);
    }
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    int header[256] = {0};
    header[0] = RL_CASE_MAGIC; header[1] = 1; header[2] = rows; header[3] = c.G; header[4] = c.mode;
    memcpy(&header[5], &c.beta, sizeof(float));
    fwrite_or_die(header, sizeof(int), 256, f, path);
    for (int i = 0; i < rows; i++) {
        int lens[2] = {(int)c.prompts[i].size(), (int)c.completions[i].size()};
        fwrite_or_die(lens, sizeof(int), 2, f, path);
        fwrite_or_die(c.prompts[i].data(), sizeof(int), lens[0], f, path);
        fwrite_or_die(c.completions[i].data(), sizeof(int), lens[1], f, path);
    }
    fwrite_or_die(c.rewards.data(), sizeof(float), rows, f, path);
    fclose_and_rename(f, tmp, path);
}

static RLCase read_rl_case(const char* path) {
    RLCase c;
    FILE* f = fopen_or_die(path, "rb");
    int header[256];
    fread_or_die(header, sizeof(int), 256, f, path);
    if (header[0] != RL_CASE_MAGIC || header[1] != 1) { die("'%s' is not an RL test case", path); }
    int rows = header[2];
    c.G = header[3];
    c.mode = header[4];
    memcpy(&c.beta, &header[5], sizeof(float));
    for (int i = 0; i < rows; i++) {
        int lens[2];
        fread_or_die(lens, sizeof(int), 2, f, path);
        std::vector<int> pr(lens[0]), co(lens[1]);
        fread_or_die(pr.data(), sizeof(int), lens[0], f, path);
        fread_or_die(co.data(), sizeof(int), lens[1], f, path);
        c.prompts.push_back(pr);
        c.completions.push_back(co);
    }
    c.rewards.resize(rows);
    fread_or_die(c.rewards.data(), sizeof(float), rows, f, path);
    fclose(f);
    return c;
}

// The MoE models: the dense model's shape (maxT 64, V 257, NH 4, C 64) with L blocks, E experts,
// top-k, every N-th block an MoE block, capacity factor cf, aux coefficient alpha. drops: 1 = the
// first forward must drop assignments, 0 = it must drop none, -1 = either (the counts must agree).
typedef struct {
    const char* name;   // files: DIR/<name>_model.bin, <name>_ref.bin (<name>_ref_masked.bin)
    const char* label;
    int L, E, k, N;
    float cf, alpha;
    int drops, masked;
    int tie;            // 1: expert 2's router row is a copy of expert 1's in every MoE block, so the
                        // two probabilities are equal for every token and the tie rule decides
} MoECase;

static const MoECase moe_cases[] = {
    {"moe_a", "MoE (a) E 4, k 2, every block, cf 0.5: dropping", 2, 4, 2, 1, 0.5f, 0.01f, 1, 1, 0},
    {"moe_b", "MoE (b) E 4, k 1, every 2nd block, cf 2", 4, 4, 1, 2, 2.0f, 0.1f, 0, 0, 0},
    {"moe_c", "MoE (c) E 8, k 2, every 2nd block, cf 1.25", 4, 8, 2, 2, 1.25f, 0.01f, -1, 0, 0},
    {"moe_d", "MoE (d) E 4, k 1, every block, cf 1.1, experts 1 and 2 tied", 2, 4, 1, 1, 1.1f, 0.01f, -1, 0, 1},
};
#define NUM_MOE_CASES ((int)(sizeof(moe_cases) / sizeof(moe_cases[0])))

static void write_inputs(const char* dir) {
    GPT2Config cfg = {64, 257, padded_vocab(257), 2, 4, 64, 0, 0, 0, 0.0f, 0.0f};   // maxT, V, Vp, L, NH, C; dense
    GPT2 model;
    gpt2_build(&model, &cfg);
    gpt2_init_random(&model, 42);
    std::string path = std::string(dir) + "/model.bin";
    gpt2_save_checkpoint(&model, path.c_str());
    RefBatch b;
    b.B = 4; b.T = 32; b.steps = 10; b.has_weights = 0;
    b.lr = 1e-3f; b.beta1 = 0.9f; b.beta2 = 0.95f; b.eps = 1e-8f; b.weight_decay = 0.1f; b.clip = 1.0f;
    Rng rng;
    rng_init(&rng, 7);
    for (int i = 0; i < b.B * b.T; i++) {
        b.inputs.push_back((int)(rng_u32(&rng) % cfg.vocab_size));
        b.targets.push_back((int)(rng_u32(&rng) % cfg.vocab_size));
    }
    write_batch((std::string(dir) + "/batch.bin").c_str(), b);
    // the same tokens with an SFT-style mask: loss only on the second half of each row
    b.has_weights = 1;
    for (int i = 0; i < b.B * b.T; i++) { b.weights.push_back((i % b.T) >= b.T / 2 ? 1.0f : 0.0f); }
    write_batch((std::string(dir) + "/batch_masked.bin").c_str(), b);
    // RLVR: a frozen reference model (another random init) and two rollout cases
    GPT2 ref;
    gpt2_build(&ref, &cfg);
    gpt2_init_random(&ref, 43);
    gpt2_save_checkpoint(&ref, (std::string(dir) + "/ref_model.bin").c_str());
    gpt2_free(&ref);
    write_rl_case((std::string(dir) + "/rl_grpo_kl.bin").c_str(), RL_GRPO, 0.5f, 11);
    write_rl_case((std::string(dir) + "/rl_top1.bin").c_str(), RL_TOP1, 0.0f, 12);
    gpt2_free(&model);
    printf("wrote %s/model.bin, batch.bin, batch_masked.bin, ref_model.bin, rl_grpo_kl.bin, rl_top1.bin\n", dir);
    // the MoE models (same batches)
    for (int i = 0; i < NUM_MOE_CASES; i++) {
        const MoECase* mc = &moe_cases[i];
        GPT2Config mcfg = {64, 257, padded_vocab(257), mc->L, 4, 64, mc->E, mc->k, mc->N, mc->cf, mc->alpha};
        GPT2 moe;
        gpt2_build(&moe, &mcfg);
        gpt2_init_random(&moe, 44 + i);
        std::string path = std::string(dir) + "/" + mc->name + "_model.bin";
        gpt2_save_checkpoint(&moe, path.c_str());
        if (mc->tie) {   // in the file: routerw[m][2] = routerw[m][1] (the file is the whole model)
            const ParamInfo* r = &moe.param_info[16];
            if (strcmp(r->name, "routerw") != 0) { die("parameter 16 is %s, expected routerw", r->name); }
            int C = mcfg.channels, Lm = gpt2_moe_layers(&mcfg);
            std::vector<float> row(C);
            FILE* f = fopen_or_die(path.c_str(), "r+b");
            for (int m = 0; m < Lm; m++) {
                long base = 256 * 4 + (long)(r->offset + (size_t)m * mc->E * C) * 4;
                fseek(f, base + 1L * C * 4, SEEK_SET);
                fread_or_die(row.data(), sizeof(float), C, f, path.c_str());
                fseek(f, base + 2L * C * 4, SEEK_SET);
                fwrite_or_die(row.data(), sizeof(float), C, f, path.c_str());
            }
            fclose(f);
        }
        gpt2_free(&moe);
        printf("wrote %s (L %d, E %d, k %d, every %d, cf %g, alpha %g)\n", path.c_str(), mc->L, mc->E, mc->k, mc->N,
               mc->cf, mc->alpha);
    }
}

// ---- comparison

static int failures = 0;

// max |ours - ref| relative to max |ref| over the tensor
static int compare(const char* what, const float* ours, const float* ref, size_t n, float tol) {
    double max_abs = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        max_abs = fmax(max_abs, fabs((double)ours[i] - ref[i]));
        max_ref = fmax(max_ref, fabs((double)ref[i]));
        if (!isfinite(ours[i])) { max_abs = INFINITY; }
    }
    double rel = max_ref > 0 ? max_abs / max_ref : max_abs;
    int ok = rel <= tol;
    printf("  %-22s %10zu   max abs err %.3e   rel to max %.3e (tol %.2g)   %s\n", what, n, max_abs, rel, tol,
           ok ? "ok" : "MISS");
    return ok;
}

// The parameters after the AdamW steps, per tensor, over the elements in idx:
//   judged: the update norm-wise, |(w - w0) - (r - r0)|_2 / |r - r0|_2, where w is what AdamW
//           updated (the fp32 master weights of the bf16 build, the parameters otherwise), w0 our
//           initial parameters (bf16 build: the checkpoint rounded to bf16), r and r0 the
//           reference's final and initial parameters;
//   shown:  the parameters norm-wise, |p - r|_2 / |r|_2, and the largest element-wise
//           difference relative to the tensor's largest |r| (the old measure).
// Why not element-wise: AdamW moves every element by ~lr per step whatever the size of its
// gradient (m / sqrt(v) ~ sign(g)). An element whose gradient is below the rounding noise
// (bf16: ~5e-3 of the tensor's largest gradient, see the gradient figures) gets a sign that
// the noise picks, and moves up to lr * steps (1e-2 here) the other way on one side: up to
// 2 lr steps apart, i.e. O(1) of a bias tensor's largest value (biases start at 0 and have
// moved by at most lr * steps). Such elements are few, so they barely move the norm of the
// difference, while a defect that affects the update (a wrong gradient, a wrong AdamW term, a
// step lost or repeated, clipping by the wrong norm) shifts most elements and the norm with
// them. The update rather than the parameters: the parameters include their initial values,
// which for the LayerNorm gains (1.0) and the weight matrices dwarf or hide 10 small steps.
// Used for the bf16 builds (tol: the measured table above) and for what is shown, not judged (the
// key bias); the fp32 builds judge with compare_update_fp32 below.
static int compare_update(const char* what, const std::vector<size_t>& idx, const float* w, const float* p,
                          const float* w0, const float* r, const float* r0, float tol) {
    double du2 = 0, ru2 = 0, dp2 = 0, rp2 = 0, max_abs = 0, max_ref = 0;
    int finite = 1;
    for (size_t k : idx) {
        double uw = (double)w[k] - w0[k], ur = (double)r[k] - r0[k];
        du2 += (uw - ur) * (uw - ur);
        ru2 += ur * ur;
        dp2 += ((double)p[k] - r[k]) * ((double)p[k] - r[k]);
        rp2 += (double)r[k] * r[k];
        max_abs = fmax(max_abs, fabs((double)p[k] - r[k]));
        max_ref = fmax(max_ref, fabs((double)r[k]));
        finite &= isfinite(w[k]) && isfinite(p[k]);
    }
    double upd = ru2 > 0 ? sqrt(du2 / ru2) : sqrt(du2), par = rp2 > 0 ? sqrt(dp2 / rp2) : sqrt(dp2);
    double elem = max_ref > 0 ? max_abs / max_ref : max_abs;
    if (!finite) { upd = INFINITY; }
    int ok = upd <= tol;
    char tol_text[32];
    snprintf(tol_text, sizeof(tol_text), isinf(tol) ? "(not judged)" : "(tol %.2g)", tol);
    printf("  %-22s %10zu   %.3e %-12s %.3e                %.3e   %s\n", what, idx.size(), upd, tol_text, par, elem,
           isinf(tol) ? "" : ok ? "ok" : "MISS");
    return ok;
}

// The fp32 update's sensitivity to the gradients, per element, first order (the way the CPU's
// kernel tests derive their bounds from float rounding, test/test_kernels.cu):
//   AdamW's step on element i at step t is lr r_t (+ the decay), r_t = mhat_t / (sqrt(vhat_t) + eps),
//   mhat_t = sum_s a_ts g_s, vhat_t = sum_s b_ts g_s^2 (s <= t; a_ts = (1-b1) b1^(t-s) / (1-b1^t),
//   b_ts = (1-b2) b2^(t-s) / (1-b2^t); g_s the clipped gradient). A change dg_s of the gradients
//   moves r_t by at most sum_s |dr_t/dg_s| |dg_s|, with
//     dr_t/dg_s = a_ts / (sqrt(vhat) + eps) - mhat b_ts g_s / (sqrt(vhat) (sqrt(vhat) + eps)^2),
//   and never by more than 2 R_t, R_t = sqrt(sum_s a_ts^2 / b_ts) >= |r_t| (Cauchy-Schwarz; 1.0 to
//   1.011 for these betas). |dr_t/dg_s| is ~1/sqrt(vhat): an element whose gradients are small or
//   change sign (so that mhat cancels while vhat does not) turns a gradient error far below the
//   gradient check's resolution into a step error of a sizeable fraction of lr.
//   The gradient error: what the gradient check accepts, tol_g x the tensor's largest |g|, at every
//   step. Each side also rounds the parameter and the step to fp32 at each step:
//   UF (2|p| + 16 lr (R_t + wd|p|)) per side and step (as test_cuda_kernels bounds one AdamW step).
//   A gradient that is exactly 0 at a step gets no gradient error at that step: a sum with no
//   terms is exact (the padded vocabulary rows at every step; an MoE expert that no token was
//   routed to at that step: case (d)'s tied expert 2 at step 1, which the routing checks cover).
// d_i = sum_t lr min(sum_s |dr_t/dg_s| e_s, 2 R_t) + the rounding term, for each element of idx (in
// idx's order), evaluated along our trajectory (our gradients of every step; the reference keeps
// only step 0's). compare_update_fp32 leaves out the elements with d_i > lr.
static const double UF32 = 1.0 / 16777216.0;   // 2^-24
static std::vector<double> update_sensitivity(const std::vector<size_t>& idx, const std::vector<std::vector<float>>& g,
                                              const std::vector<float>& scale, const RefBatch& b, float tol_g,
                                              int decay, const float* r, const float* r0) {
    int S = (int)g.size();
    double b1 = b.beta1, b2 = b.beta2, eps = b.eps, lr = b.lr, wd = decay ? b.weight_decay : 0.0;
    std::vector<double> e(S, 0.0), R(S + 1, 0.0), out;
    out.reserve(idx.size());
    for (int s = 0; s < S; s++) {
        for (size_t k : idx) { e[s] = fmax(e[s], fabs((double)g[s][k])); }
        e[s] *= tol_g * scale[s];
    }
    std::vector<std::vector<double>> a(S + 1, std::vector<double>(S, 0.0)), bb = a;
    for (int t = 1; t <= S; t++) {
        for (int s = 0; s < t; s++) {
            a[t][s] = (1 - b1) * pow(b1, t - 1 - s) / (1 - pow(b1, t));
            bb[t][s] = (1 - b2) * pow(b2, t - 1 - s) / (1 - pow(b2, t));
            R[t] += a[t][s] * a[t][s] / bb[t][s];
        }
        R[t] = sqrt(R[t]);
    }
    std::vector<double> gs(S);
    for (size_t k : idx) {
        double ur = (double)r[k] - r0[k], pk = fabs((double)r0[k]) + fabs(ur), d = 0.0;
        bool zero = true;
        for (int s = 0; s < S; s++) { gs[s] = (double)g[s][k] * scale[s]; zero &= g[s][k] == 0.0f; }
        for (int t = 1; t <= S; t++) {
            d += 2.0 * UF32 * (2.0 * pk + 16.0 * lr * (R[t] + wd * pk));   // both sides' fp32 roundings
            if (zero) { continue; }
            double mh = 0.0, vh = 0.0;
            for (int s = 0; s < t; s++) { mh += a[t][s] * gs[s]; vh += bb[t][s] * gs[s] * gs[s]; }
            double sv = sqrt(vh), den = sv + eps, dr = 0.0;
            for (int s = 0; s < t; s++) {
                if (gs[s] == 0.0) { continue; }   // exactly 0 at this step: exact (see above)
                dr += fabs(a[t][s] / den - mh * bb[t][s] * gs[s] / (fmax(sv, 1e-300) * den * den)) * e[s];
            }
            d += lr * fmin(dr, 2.0 * R[t]);
        }
        out.push_back(d);
    }
    return out;
}

// The fp32 update after the AdamW steps (the CPU and the CUDA PRECISION=FP32 build), per tensor:
//   1. left out: the elements whose update the gradient tolerance leaves undetermined, d_i > lr
//      (update_sensitivity: at the gradient tolerance their 10-step update is uncertain by more
//      than one whole step; fcw's median element's d_i is 3.5e-3 lr). Printed: how many and their
//      share. More than 10% of a tensor's elements is a MISS: the rule depends on our gradients
//      only, and a run must not pass by making many elements "ill-conditioned". (On the bundle's
//      inputs: qkvw 206 of 24576 = 0.84%, qkvb 2 of 256 = 0.78%, fcw, fcprojw, wte 2 each, the
//      rest none, the same over 12 noise seeds; the 4-layer MoE models leave out up to 4.6% of
//      qkvw, 5.1% of qkvb: their later layers' attention gradients are small.)
//   2. over the rest, e = (w - w0) - (r - r0), u = r - r0, judged three ways:
//      - norm:  |e|_2 / |u|_2 <= 1e-3 (update[]; the CPU build: 1e-4, see tolerances_for);
//      - scale: <e, u> / <u, u>, |.| <= 1e-4: the error's component along the update itself, what
//               a wrong learning rate (or schedule, or clipping factor) gives: lr x1.001 -> 5e-4
//               to 1.1e-3;
//      - decay: <e, z> / <z, z>, z = -lr wd steps (r0 + r) / 2 (the decoupled weight decay's share
//               of the update, decayed tensors only), |.| <= 1e-2: weight decay x1.1 -> 0.1.
// Why this and not one norm-wise 1e-4 over every element (the old test; it failed on an H200 at fcw
// 1.3e-4, fcprojw 1.7e-4): on the bundle's inputs (weights rounded to bf16), some step-1 gradients
// cancel to below eps (fcprojw[3158]: -6.8e-9) and AdamW's first step g / (|g| + eps) moves with
// them at 3.5e7: summation-order noise picks an lr-sized step there. Those elements are what rule 1
// leaves out (fcprojw 2 of 32768, qkvw 206 of 24576 = 0.84%). But their steps also change the later
// forward passes: fcw's later-step gradients then differ by up to 1.6e-3 of its largest, 16x the
// gradient tolerance, and its largest update errors sit on the elements coupled to the left-out
// ones (row 86, the inputs of the hidden unit whose output weight is fcprojw[3158]), though their
// own sensitivity is small (fcw[5504]: d_i = 0.05 lr). So gradient noise of the H200's size
// (test/reference/adamw_elements.py --noise 1e-6: +-1e-6 of each tensor's largest |g| on every
// element at every step, 12 seeds) leaves norm-wise errors up to 4.2e-4 (fcw) on the kept elements,
// 1.2e-4 to 3.1e-4 on 13 other tensors: a norm at 1e-4 fails such noise, and the norm cannot tell
// weight decay x1.1 (1.7e-4 to 4.5e-4 on the decayed tensors) from it. The projections can: noise
// spreads its error over directions that have nothing to do with u or z, so its scale stays <=
// 2.5e-5 and its decay <= 1.6e-3 (the same 12 seeds), while lr x1.001 gives a scale of 4.8e-4 to
// 1.1e-3 on every tensor and weight decay x1.1 a decay of 0.098 to 0.101 on every decayed one. The
// norm at 1e-3 (2.4x the noise's 4.2e-4) catches what changes the update's shape rather than its
// size (bias corrections, eps): test/h200_failures.sh, doc/gpu-results.md. At 3x the noise (s =
// 3e-6) 1 of 12 seeds misses, at 1e-5 all do. The CPU build keeps the old 1e-4 for the norm (over
// the kept elements): its own errors are <= 5.5e-6 on the reference suite's inputs (4.5e-5 on the
// bundle's), and it is deterministic.
static int compare_update_fp32(const char* what, const std::vector<size_t>& idx, const std::vector<double>& d,
                               const float* w, const float* p, const float* w0, const float* r, const float* r0,
                               const RefBatch& b, int decay, const Tolerances& tol, float norm_tol) {
    double du2 = 0, ru2 = 0, eu = 0, ez = 0, zz = 0, dp2 = 0, rp2 = 0;
    double wd = decay ? b.weight_decay : 0.0;
    size_t left = 0;
    int finite = 1;
    for (size_t j = 0; j < idx.size(); j++) {
        size_t k = idx[j];
        finite &= isfinite(w[k]) && isfinite(p[k]);
        dp2 += ((double)p[k] - r[k]) * ((double)p[k] - r[k]);
        rp2 += (double)r[k] * r[k];
        if (d[j] > (double)tol.update_left_lr * b.lr) { left++; continue; }
        double ur = (double)r[k] - r0[k], e = ((double)w[k] - w0[k]) - ur;
        double z = -(double)b.lr * wd * b.steps * 0.5 * ((double)r0[k] + r[k]);
        du2 += e * e; ru2 += ur * ur; eu += e * ur; ez += e * z; zz += z * z;
    }
    double share = idx.empty() ? 0.0 : (double)left / idx.size();
    double upd = ru2 > 0 ? sqrt(du2 / ru2) : sqrt(du2), scale = ru2 > 0 ? eu / ru2 : 0.0, dec = zz > 0 ? ez / zz : 0.0;
    double par = rp2 > 0 ? sqrt(dp2 / rp2) : sqrt(dp2);
    if (!finite) { upd = INFINITY; }
    int ok = upd <= norm_tol && fabs(scale) <= tol.update_scale && share <= tol.update_left_cap;
    char dec_text[40] = "-";
    if (decay) {
        ok &= fabs(dec) <= tol.update_decay;
        snprintf(dec_text, sizeof(dec_text), "%+.1e", dec);
    }
    printf("  %-20s %6zu %5zu %6.2f%%   %.3e  %+.1e  %8s   %.3e   %s\n", what, idx.size(), left, 100.0 * share, upd,
           scale, dec_text, par, ok ? "ok" : "MISS");
    return ok;
}

static void report(const char* name, int ok) {
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) { failures++; }
}

// every parameter tensor's gradient against the reference's, one PASS/FAIL line
static void report_gradients(const char* label, const GPT2* model, const std::vector<float>& grads,
                             const std::vector<float>& ref_grads, const Tolerances& tol) {
    int all_ok = 1, tensors = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
        if (p->numel == 0) { continue; }   // not in this model (a dense model's MoE tensors)
        std::string name = std::string("d") + p->name;
        all_ok &= compare(name.c_str(), grads.data() + p->offset, ref_grads.data() + p->offset, p->numel, tol.grads[i]);
        tensors++;
    }
    report((std::string(label) + ": gradients of all " + std::to_string(tensors) + " parameter tensors").c_str(),
           all_ok);
}

// model_name: the checkpoint in dir; mc: the MoE case (NULL: a dense model), whose dropping
// expectation is checked and whose loss adds the auxiliary loss
static void check_case(const char* dir, const char* model_name, const char* batch_name, const char* ref_name,
                       const char* label, const MoECase* mc) {
    std::string d(dir);
    GPT2 model;
    gpt2_load_checkpoint(&model, (d + "/" + model_name).c_str());
    RefBatch b = read_batch((d + "/" + batch_name).c_str());
    int B = b.B, T = b.T, V = model.config.vocab_size, Vp = model.config.padded_vocab_size;
    size_t BT = (size_t)B * T, P = model.num_parameters;
    std::string ref_path = d + "/" + ref_name;
    FILE* f = fopen_or_die(ref_path.c_str(), "rb");
    int header[256];
    fread_or_die(header, sizeof(int), 256, f, ref_path.c_str());
    if (header[0] != REF_MAGIC || header[1] != 1 || header[2] != B || header[3] != T || header[4] != V ||
        header[5] != b.steps || (size_t)header[6] != P) {
        die("'%s' does not match the model and batch (regenerate it with test/reference/gpt2.py)", ref_path.c_str());
    }
    std::vector<float> ref_logits(BT * V), ref_grads(P), ref_step_losses(b.steps), ref_norms(b.steps), ref_params(P);
    float ref_loss;
    fread_or_die(ref_logits.data(), sizeof(float), ref_logits.size(), f, ref_path.c_str());
    fread_or_die(&ref_loss, sizeof(float), 1, f, ref_path.c_str());
    fread_or_die(ref_grads.data(), sizeof(float), P, f, ref_path.c_str());
    fread_or_die(ref_step_losses.data(), sizeof(float), b.steps, f, ref_path.c_str());
    fread_or_die(ref_norms.data(), sizeof(float), b.steps, f, ref_path.c_str());
    fread_or_die(ref_params.data(), sizeof(float), P, f, ref_path.c_str());
    fclose(f);
    // the reference's number format (slot 10): 1 = gpt2.py --dtype bfloat16, for the CPU's
    // --precision bf16; 0 = fp32 (or float64), for every other run (the CUDA bf16 build is
    // checked against the fp32 reference)
#ifdef LLMC_CPU
    int want_format = backend_precision() == PREC_BF16;
#else
    int want_format = 0;
#endif
    if (header[10] != want_format) {
        die("'%s' is a %s reference, this run stores %s (bf16: gpt2.py --dtype bfloat16 and test_gpt2cpu --precision bf16)",
            ref_path.c_str(), header[10] == 1 ? "bf16" : "fp32", precision_name(backend_precision()));
    }
    // MoE (header slots 7..9): assignments dropped and aux loss of the first forward, MoE blocks
    size_t ref_dropped = (size_t)header[7];
    float ref_aux;
    memcpy(&ref_aux, &header[8], sizeof(float));
    int moe = gpt2_is_moe(&model.config), Lm = gpt2_moe_layers(&model.config);
    if (header[9] != Lm || (mc != NULL) != (moe != 0)) {
        die("'%s' has %d MoE blocks, the model %d (regenerate it with test/reference/gpt2.py)", ref_path.c_str(),
            header[9], Lm);
    }

    Tolerances tol = want_format == 1 ? tolerances_bf16_simulation() : tolerances_for_build();
    printf("\n[%s] B %d, T %d, L %d, NH %d, C %d, V %d (Vp %d), %zu parameters\n", label, B, T,
           model.config.num_layers, model.config.num_heads, model.config.channels, V, Vp, P);
    if (moe) {
        const GPT2Config* c = &model.config;
        printf("  MoE: E %d, top-%d, every %d-th block (%d MoE blocks), capacity factor %g -> %d per expert and "
               "sequence, aux %g\n", c->num_experts, c->moe_topk, c->moe_every, Lm, c->moe_capacity,
               (int)ceil((double)c->moe_capacity * T * c->moe_topk / c->num_experts), c->moe_aux);
    }
    gpt2_allocate_activations(&model, B, T);
    std::vector<float> init_params(P), ref_init(P);
    copy_floats_to_host(init_params.data(), model.params_memory, P);
    {
        FILE* mf = fopen_or_die((d + "/" + model_name).c_str(), "rb");
        fseek(mf, 256 * sizeof(int), SEEK_SET);
        fread_or_die(ref_init.data(), sizeof(float), P, mf, model_name);
        fclose(mf);
        // the bf16 reference starts from the file's parameters rounded to bf16 (its master
        // weights too), so its update is measured from those
        if (header[10] == 1) {
            for (float& x : ref_init) { x = round_bf16(x); }
        }
    }
    // the loss averages over the tokens with a non-zero weight
    double count = 0;
    for (size_t i = 0; i < BT; i++) { count += b.has_weights ? (b.weights[i] != 0.0f) : 1.0; }
    float dloss = (float)(1.0 / count);
    const float* w = b.has_weights ? b.weights.data() : NULL;

    // forward: logits (the real V columns of each row)
    gpt2_forward(&model, b.inputs.data(), B, T);
    std::vector<float> logits(BT * Vp), logits_v(BT * V);
    copy_floats_to_host(logits.data(), model.logits, BT * Vp);
    for (size_t i = 0; i < BT; i++) { memcpy(&logits_v[i * V], &logits[i * Vp], V * sizeof(float)); }
    report((std::string(label) + ": logits").c_str(), compare("logits", logits_v.data(), ref_logits.data(), BT * V, tol.logits));

    // loss and backward
    gpt2_zero_grad(&model);
    float loss = gpt2_classifier(&model, b.targets.data(), w, dloss, 1) * dloss;
    if (moe) {
        // the auxiliary loss on its own (it is ~1e-3 of the total), and the tokens dropped
        float aux = gpt2_aux_loss(&model, 0);
        size_t dropped = gpt2_moe_dropped(&model, 0);
        loss += aux;
        float aux_rel = fabsf(aux - ref_aux) / fabsf(ref_aux);
        printf("  %-22s ours %.7f   ref %.7f   rel err %.2e (tol %.2g)\n", "aux loss", aux, ref_aux, aux_rel, tol.loss);
        report((std::string(label) + ": auxiliary load-balancing loss").c_str(), aux_rel <= tol.loss);
        size_t assignments = (size_t)B * T * model.config.moe_topk * Lm;
        int drop_ok = dropped == ref_dropped && (mc->drops < 0 || (mc->drops ? dropped > 0 : dropped == 0));
        printf("  dropped assignments    ours %zu   ref %zu   of %zu (expected: %s)\n", dropped, ref_dropped, assignments,
               mc->drops < 0 ? "either" : mc->drops ? "some" : "none");
        report((std::string(label) + ": dropped assignments (capacity) agree" +
                (mc->drops < 0 ? "" : mc->drops ? ", and some were dropped" : ", none dropped")).c_str(), drop_ok);
    }
    gpt2_backward(&model);
    float loss_rel = fabsf(loss - ref_loss) / fabsf(ref_loss);
    printf("  %-22s ours %.7f   ref %.7f   rel err %.2e (tol %.2g)\n", moe ? "loss (CE + aux)" : "loss", loss,
           ref_loss, loss_rel, tol.loss);
    report((std::string(label) + ": loss").c_str(), loss_rel <= tol.loss);

    std::vector<float> grads(P);
    copy_floats_to_host(grads.data(), model.grads_memory, P);
    report_gradients(label, &model, grads, ref_grads, tol);

    // the optimizer: `steps` AdamW steps on the same batch
    gpt2_zero_grad(&model);   // restart from the initial parameters' gradients
    int steps_ok = 1;
    printf("  step   loss ours     loss ref      rel err     norm ours  norm ref   rel err   (tol %.0e, %.0e)\n",
           tol.step_loss, tol.step_norm);
    // TEST_GPT2_DUMP=DIR (a diagnostic, off by default): the case's initial parameters, each step's
    // gradients (before clipping) and the final parameters AdamW updated, as float32 in
    // DIR/<ref>.ours (P floats each, in that order: 1 + steps + 1 arrays), for an element-by-element
    // comparison with a reference (test/reference/adamw_elements.py)
    std::vector<std::vector<float>> step_grads;   // our gradients of every step (update_sensitivity, the dump)
    std::vector<float> step_scales;
    const char* dump_dir = getenv("TEST_GPT2_DUMP");
    FILE* dump = NULL;
    std::string dump_path;
    if (dump_dir && *dump_dir) {
        dump_path = std::string(dump_dir) + "/" + ref_name + ".ours";
        dump = fopen_or_die(dump_path.c_str(), "wb");
        fwrite_or_die(init_params.data(), sizeof(float), P, dump, dump_path.c_str());
    }
    for (int s = 0; s < b.steps; s++) {
        gpt2_zero_grad(&model);
        gpt2_forward(&model, b.inputs.data(), B, T);
        float l = gpt2_classifier(&model, b.targets.data(), w, dloss, 1) * dloss;
        if (moe) { l += gpt2_aux_loss(&model, 0); }
        gpt2_backward(&model);
        if (dump || tol.update_fp32) {
            step_grads.emplace_back(P);
            copy_floats_to_host(step_grads.back().data(), model.grads_memory, P);
            if (dump) { fwrite_or_die(step_grads.back().data(), sizeof(float), P, dump, dump_path.c_str()); }
        }
        float norm = gpt2_update(&model, b.lr, b.beta1, b.beta2, b.eps, b.weight_decay, b.clip);
        step_scales.push_back(b.clip > 0.0f && norm > b.clip ? b.clip / norm : 1.0f);   // as gpt2_update clips
        float rel = fabsf(l - ref_step_losses[s]) / fabsf(ref_step_losses[s]);
        float norm_rel = fabsf(norm - ref_norms[s]) / fabsf(ref_norms[s]);
        int ok = rel <= tol.step_loss && norm_rel <= tol.step_norm;
        steps_ok &= ok;
        printf("  %4d   %.7f     %.7f     %.2e    %.5f    %.5f    %.2e  %s\n", s + 1, l, ref_step_losses[s], rel, norm,
               ref_norms[s], norm_rel, ok ? "ok" : "MISS");
    }
    report((std::string(label) + ": 10 AdamW steps (losses and gradient norms)").c_str(), steps_ok);
    std::vector<float> params(P), master(P);
    copy_floats_to_host(params.data(), model.params_memory, P);
    if (model.master_memory) {
        copy_device_to_host(master.data(), model.master_memory, P * sizeof(float));
    } else {
        master = params;   // fp32: the parameters are what AdamW updates
    }
    if (dump) {
        fwrite_or_die(master.data(), sizeof(float), P, dump, dump_path.c_str());
        fclose(dump);
    }
    int all_ok = 1;
    int C = model.config.channels;
    if (tol.update_fp32) {
        printf("  update after the steps, fp32 (compare_update_fp32): elements with sensitivity d_i > %g lr left out "
               "(at most %g%%); over the rest, norm (tol %g), scale (tol %g), decay (tol %g)\n", tol.update_left_lr,
               100.0 * tol.update_left_cap, tol.update[0], tol.update_scale, tol.update_decay);
        printf("  %-20s %6s %5s %7s   %-10s %-8s %-8s   %-10s\n", "parameter", "n", "left", "share", "norm err",
               "scale", "decay", "params err (shown)");
    } else {
        printf("  %-22s %10s   %-22s %-24s %s\n", "parameter", "n", "update err (judged)", "params err (shown)",
               "max elem err (shown)");
    }
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model.param_info[i];
        if (p->numel == 0) { continue; }   // not in this model
        std::vector<size_t> idx;
        for (size_t j = 0; j < p->numel; j++) {
            int is_key = strcmp(p->name, "qkvb") == 0 && (int)(j % (3 * C)) >= C && (int)(j % (3 * C)) < 2 * C;
            if (!is_key) { idx.push_back(p->offset + j); }
        }
        const char* shown = strcmp(p->name, "qkvb") == 0 ? "qkvb (query, value)" : p->name;
        if (tol.update_fp32) {
            std::vector<double> d = update_sensitivity(idx, step_grads, step_scales, b, tol.grads[i], p->decay,
                                                       ref_params.data(), ref_init.data());
            all_ok &= compare_update_fp32(shown, idx, d, master.data(), params.data(), init_params.data(),
                                          ref_params.data(), ref_init.data(), b, p->decay, tol, tol.update[i]);
        } else {
            all_ok &= compare_update(shown, idx, master.data(), params.data(), init_params.data(), ref_params.data(),
                                     ref_init.data(), tol.update[i]);
        }
        if (strcmp(p->name, "qkvb") == 0) {
            // The key bias gets no gradient in exact arithmetic (adding b to every key adds q.b to
            // every score of a row, which softmax ignores), so both sides hold rounding noise of
            // ~1e-10 there, and Adam's m/sqrt(v) turns noise of any size into steps of size lr.
            std::vector<size_t> keys;
            for (int l = 0; l < model.config.num_layers; l++) {
                for (int j = C; j < 2 * C; j++) { keys.push_back(p->offset + (size_t)l * 3 * C + j); }
            }
            compare_update("qkvb (key: noise only)", keys, master.data(), params.data(), init_params.data(),
                           ref_params.data(), ref_init.data(), INFINITY);
        }
    }
    if (model.master_memory) {
        // the bf16 parameters the model computes with are the fp32 master weights stochastically
        // rounded: each within one bf16 ulp of its master value (an exact property, no estimate)
        size_t bad = 0;
        for (size_t k = 0; k < P; k++) {
            int e;
            frexpf(master[k], &e);
            float ulp = master[k] == 0.0f ? 0.0f : ldexpf(1.0f, e - 8);   // 8 significant bits
            if (!(fabsf(params[k] - master[k]) <= ulp)) { bad++; }
        }
        printf("  bf16 parameters vs fp32 master weights: %zu of %zu elements more than one bf16 ulp apart\n", bad, P);
        all_ok &= bad == 0;
    }
    report((std::string(label) + ": parameters after the AdamW steps").c_str(), all_ok);
    gpt2_free(&model);
}

// The RLVR loss on fixed rollouts, as the trainer computes it (llmc/tasks/rlvr_rollouts.h: advantages,
// log-probabilities of the policy and the reference, loss weights, dloss = 1/N), against
// test/reference/rlvr.py.
static void check_rl_case(const char* dir, const char* case_name, const char* ref_name, const char* label) {
    std::string d(dir);
    GPT2 model, ref;
    gpt2_load_checkpoint(&model, (d + "/model.bin").c_str());
    gpt2_load_checkpoint(&ref, (d + "/ref_model.bin").c_str());
    RLCase c = read_rl_case((d + "/" + case_name).c_str());
    int rows = (int)c.prompts.size(), P = rows / c.G;
    size_t NP = model.num_parameters;
    RolloutBatch rb;
    rollout_batch_build(&rb, c.prompts, c.completions, 256, 1);
    gpt2_allocate_activations(&model, rows, rb.T);
    gpt2_allocate_activations(&ref, rows, rb.T);
    Advantage a = {c.mode, 0.0f, 0};
    std::vector<float> adv(rows);
    rl_advantages(&a, c.rewards.data(), P, c.G, adv.data());
    long N = 0;
    for (int i = 0; i < rows; i++) { N += (long)c.completions[i].size(); }
    if (c.beta > 0.0f) {
        rl_logp(&model, &rb, &rb.logp);
        rl_logp(&ref, &rb, &rb.logp_ref);
    }
    std::vector<float> weights;
    double pg = 0.0, kl = 0.0;
    rl_token_weights(&rb, adv.data(), c.beta, &weights, &pg, &kl);
    float dloss = 1.0f / (float)N;
    gpt2_zero_grad(&model);
    gpt2_forward(&model, rb.inputs.data(), rows, rb.T);
    float loss = gpt2_classifier(&model, rb.targets.data(), weights.data(), dloss, 1) * dloss;
    gpt2_backward(&model);
    if (c.beta > 0.0f) { loss = (float)(pg / N + c.beta * kl / N); }

    std::string ref_path = d + "/" + ref_name;
    FILE* f = fopen_or_die(ref_path.c_str(), "rb");
    int header[256];
    fread_or_die(header, sizeof(int), 256, f, ref_path.c_str());
    if (header[0] != RL_REF_MAGIC || header[1] != 1 || (size_t)header[2] != NP || header[3] != N) {
        die("'%s' does not match the model and case (regenerate it with test/reference/rlvr.py)", ref_path.c_str());
    }
    float ref_loss;
    std::vector<float> ref_grads(NP), grads(NP);
    fread_or_die(&ref_loss, sizeof(float), 1, f, ref_path.c_str());
    fread_or_die(ref_grads.data(), sizeof(float), NP, f, ref_path.c_str());
    fclose(f);

    Tolerances tol = tolerances_for_build();
    printf("\n[%s] %d rows (G %d), T %d, %ld completion tokens, beta %g\n", label, rows, c.G, rb.T, N, c.beta);
    int adv_ok = 1;
    for (int i = 0; i < rows; i++) { adv_ok &= isfinite(adv[i]); }
    for (float w : weights) { adv_ok &= isfinite(w); }
    report((std::string(label) + ": advantages and loss weights finite (a zero-variance group gives A = 0)").c_str(), adv_ok);
    float loss_rel = fabsf(loss - ref_loss) / std::max(1e-6f, fabsf(ref_loss));
    printf("  %-22s ours %.7f   ref %.7f   rel err %.2e (tol %.2g)\n", "loss", loss, ref_loss, loss_rel, tol.rl_loss);
    report((std::string(label) + ": loss").c_str(), loss_rel <= tol.rl_loss);
    copy_floats_to_host(grads.data(), model.grads_memory, NP);
    report_gradients(label, &model, grads, ref_grads, tol);
    gpt2_free(&model);
    gpt2_free(&ref);
}

#ifndef LLMC_CPU
// ---- determinism (CUDA build): the same steps give the same bits, also across a save/reload

// steps [from, to) of AdamW on the batch, appending each step's loss
static void train_steps(GPT2* model, const RefBatch& b, int from, int to, std::vector<float>* losses) {
    double count = 0;
    for (size_t i = 0; i < b.inputs.size(); i++) { count += b.has_weights ? (b.weights[i] != 0.0f) : 1.0; }
    float dloss = (float)(1.0 / count);
    const float* w = b.has_weights ? b.weights.data() : NULL;
    for (int s = from; s < to; s++) {
        gpt2_zero_grad(model);
        gpt2_forward(model, b.inputs.data(), b.B, b.T);
        float l = gpt2_classifier(model, b.targets.data(), w, dloss, 1) * dloss;
        gpt2_backward(model);
        gpt2_update(model, b.lr, b.beta1, b.beta2, b.eps, b.weight_decay, b.clip);
        losses->push_back(l);
    }
}

// parameters, then the fp32 master weights when there are any, as raw bytes
static std::vector<float> model_state_bits(GPT2* model) {
    size_t P = model->num_parameters;
    std::vector<float> out(P);
    copy_floats_to_host(out.data(), model->params_memory, P);
    if (model->master_memory) {
        out.resize(2 * P);
        copy_device_to_host(out.data() + P, model->master_memory, P * sizeof(float));
    }
    return out;
}

static int same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

static void determinism_check(const char* dir) {
    std::string d(dir);
    std::string model_path = d + "/model.bin", ckpt = d + "/resume_model.bin", state = d + "/resume_state.bin";
    RefBatch b = read_batch((d + "/batch.bin").c_str());
    // 6 steps, saved after 3: a race shows from the first step, and every piece of the optimizer
    // state (m, v, t) is used by the steps after the reload
    const int steps = 6, split = 3;
    printf("\n[determinism] %d AdamW steps, twice; then %d steps, save, reload, %d more\n", steps, split, steps - split);
    std::vector<float> losses_a, losses_b, losses_c;
    std::vector<float> bits_a, bits_b, bits_c;
    for (int run = 0; run < 2; run++) {
        GPT2 model;
        gpt2_load_checkpoint(&model, model_path.c_str());
        gpt2_allocate_activations(&model, b.B, b.T);
        train_steps(&model, b, 0, steps, run == 0 ? &losses_a : &losses_b);
        (run == 0 ? bits_a : bits_b) = model_state_bits(&model);
        gpt2_free(&model);
    }
    for (int s = 0; s < steps; s++) {
        printf("  step %2d   run 1 %.9g   run 2 %.9g   %s\n", s + 1, losses_a[s], losses_b[s],
               losses_a[s] == losses_b[s] ? "same" : "DIFFERENT");
    }
    report("determinism: two runs of 6 steps give identical losses and parameters",
           same_bits(losses_a, losses_b) && same_bits(bits_a, bits_b));

    GPT2 model;
    gpt2_load_checkpoint(&model, model_path.c_str());
    gpt2_allocate_activations(&model, b.B, b.T);
    train_steps(&model, b, 0, split, &losses_c);
    gpt2_save_checkpoint(&model, ckpt.c_str());
    gpt2_save_state(&model, state.c_str());
    gpt2_free(&model);
    GPT2 resumed;
    gpt2_load_checkpoint(&resumed, ckpt.c_str());
    gpt2_allocate_activations(&resumed, b.B, b.T);
    gpt2_load_state(&resumed, state.c_str());
    train_steps(&resumed, b, split, steps, &losses_c);
    bits_c = model_state_bits(&resumed);
    gpt2_free(&resumed);
    for (int s = split; s < steps; s++) {
        printf("  step %2d   uninterrupted %.9g   resumed %.9g   %s\n", s + 1, losses_a[s], losses_c[s],
               losses_a[s] == losses_c[s] ? "same" : "DIFFERENT");
    }
    report("determinism: save at step 3, reload, continue to 6: bit-identical to the uninterrupted run",
           same_bits(losses_a, losses_c) && same_bits(bits_a, bits_c));
}
#endif

int main(int argc, char** argv) {
    backend_init(0);   // the CUDA build: pick the GPU (clear message when there is none)
#ifndef LLMC_CPU
    printf("backend: %s on %s\n", BACKEND_NAME, backend_device_name());
    if (argc == 3 && strcmp(argv[1], "--determinism") == 0) {
        determinism_check(argv[2]);
        return failures ? 1 : 0;
    }
#endif
    if (argc == 3 && strcmp(argv[1], "--write-inputs") == 0) {
        write_inputs(argv[2]);
        return 0;
    }
#ifdef LLMC_CPU
    // --check DIR --precision bf16: the CPU backend storing bf16 (llmc/cpu/memory.h) against the
    // bf16 reference (gpt2.py --dtype bfloat16: ref_bf16.bin, ref_bf16_masked.bin), held to the
    // CUDA bf16 build's tolerances. The dense model only (the MoE cases: see the bf16 branch
    // below); the RLVR cases against their fp32 reference, as the CUDA bf16 build checks them.
    if (argc == 5 && strcmp(argv[1], "--check") == 0 && strcmp(argv[3], "--precision") == 0) {
        int prec = precision_parse(argv[4]);
        if (prec != PREC_BF16) { die("--check --precision: only bf16 has a reference (gpt2.py --dtype bfloat16)"); }
        backend_set_precision(prec);
        check_case(argv[2], "model.bin", "batch.bin", "ref_bf16.bin", "bf16 pre-training loss", NULL);
        check_case(argv[2], "model.bin", "batch_masked.bin", "ref_bf16_masked.bin", "bf16 masked loss", NULL);
        printf("\n[bf16 MoE] not checked: discrete routing, near-tie top-k decisions flip under bf16 rounding "
               "(the fp32 run checks them)\n");
        check_rl_case(argv[2], "rl_grpo_kl.bin", "rl_grpo_kl_ref.bin", "bf16 RLVR: GRPO advantages + KL penalty (fp32 reference)");
        check_rl_case(argv[2], "rl_top1.bin", "rl_top1_ref.bin", "bf16 RLVR: top-1, A = r, no KL (fp32 reference)");
        printf("\n%s\n", failures ? "bf16 reference check FAILED" : "bf16 reference check passed");
        return failures ? 1 : 0;
    }
#endif
    if (argc == 3 && strcmp(argv[1], "--check") == 0) {
        check_case(argv[2], "model.bin", "batch.bin", "ref.bin", "pre-training loss", NULL);
        check_case(argv[2], "model.bin", "batch_masked.bin", "ref_masked.bin", "masked loss", NULL);
#if defined(LLMC_CPU) || defined(ENABLE_FP32)
        for (int i = 0; i < NUM_MOE_CASES; i++) {
            const MoECase* mc = &moe_cases[i];
            std::string model_name = std::string(mc->name) + "_model.bin", ref = std::string(mc->name) + "_ref.bin";
            check_case(argv[2], model_name.c_str(), "batch.bin", ref.c_str(), mc->label, mc);
            if (mc->masked) {
                std::string ref_m = std::string(mc->name) + "_ref_masked.bin", label = std::string(mc->label) + ", masked";
                check_case(argv[2], model_name.c_str(), "batch_masked.bin", ref_m.c_str(), label.c_str(), mc);
            }
        }
#else
        // bf16: the routing is discrete, and at init the router's probabilities are close (E
        // experts near 1/E): 18 of case (a)'s 256 top-k decisions are closer than 1e-3, which
        // bf16's rounding of the router input flips, and a flipped token gets another expert's
        // output (measured under the emulator: logits 0.12 of their max apart, dropped counts
        // equal). The MoE cases are checked by the fp32 builds (CPU, and CUDA PRECISION=FP32).
        printf("\n[MoE] not checked in the bf16 build (discrete routing: near-tie top-k decisions flip in bf16); "
               "the fp32 builds check them\n");
#endif
        check_rl_case(argv[2], "rl_grpo_kl.bin", "rl_grpo_kl_ref.bin", "RLVR: GRPO advantages + KL penalty");
        check_rl_case(argv[2], "rl_top1.bin", "rl_top1_ref.bin", "RLVR: top-1, A = r, no KL");
        {   // a verifier that returns NaN or infinity: counted, treated as reward 0, no NaN advantage
            float r[6] = {1.0f, NAN, INFINITY, 0.0f, -INFINITY, 1.0f};
            int bad = rl_sanitize_rewards(r, 6);
            float adv[6];
            Advantage a = {RL_GRPO, 0.0f, 0};
            rl_advantages(&a, r, 2, 3, adv);
            int ok = bad == 3;
            for (float x : adv) { ok &= isfinite(x); }
            printf("\n[RLVR: non-finite rewards] 3 of 6 replaced by 0, advantages %g %g %g | %g %g %g\n", adv[0], adv[1],
                   adv[2], adv[3], adv[4], adv[5]);
            report("RLVR: non-finite rewards are counted and scored 0, advantages stay finite", ok);
        }
#ifndef LLMC_CPU
        determinism_check(argv[2]);
#endif
        printf("\n%s\n", failures ? "reference check FAILED" : "reference check passed");
        return failures ? 1 : 0;
    }
#ifndef LLMC_CPU
    fprintf(stderr, "usage: %s --write-inputs DIR | --check DIR | --determinism DIR\n", argv[0]);
#else
    fprintf(stderr, "usage: %s --write-inputs DIR | --check DIR [--precision bf16]\n", argv[0]);
#endif
    return 2;
}
