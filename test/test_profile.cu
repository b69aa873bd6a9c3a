// --profile's accounting (llmc/profile.h, llmc/profile_costs.h) against the model's own counts, on
// a small random model, two recorded steps of forward, loss, backward and AdamW:
//   FLOPs   the matmul rows sum to 6 FLOPs per matmul weight per token, the attention rows to
//           12 L C T per token; together they are gpt2_flops_per_token less the 6 FLOPs per token
//           it counts for the parameters outside the matmuls (wpe, biases, layernorms)
//   bytes   the forward rows write exactly the activations the model keeps for the backward
//           (gpt2_activation_formula: per slot, less the token ids, targets, weights and losses);
//           the classifier writes the losses and dlogits; AdamW moves 28 bytes a parameter (fp32
//           parameter, gradient, m, v read; parameter, m, v written), zeroing the gradients
//           writes them once, their norm reads them once
//   calls   each operation as often as the model calls it: 4 L + 1 matmuls each way, 2 L + 1
//           layernorms, L attentions, GELUs, 2 L residuals, one AdamW call per tensor (the nested
//           adamw_host is not counted again)
//   time    the rows' time fits inside the step's: no scope counted twice
//   bound   max(FLOPs / peak, bytes / bandwidth): the LM head's by its FLOPs, AdamW's by its bytes
// Prints PASS/FAIL per check; exits 1 if any failed. (test/test_profile.sh also checks the
// trainer's printed table adds up.)
#include <vector>
#include <string>
#include "../llmc/common.h"
#include "../llmc/model/gpt2.h"
#include "../llmc/model/step.h"
#include "../llmc/train/profile_report.h"

static int failures = 0;
static void report(const char* name, int ok, double got, double want) {
    printf("%s %-64s %.6g (expected %.6g)\n", ok ? "PASS" : "FAIL", name, got, want);
    if (!ok) { failures++; }
}
static void check_equal(const char* name, double got, double want) {
    report(name, fabs(got - want) <= 1e-9 * fabs(want), got, want);
}

static const int L = 3, NH = 4, C = 64, MAXT = 16, V = 67, B = 2, T = 16, STEPS = 2;

// the summed cost of the rows named `name` in `part` (all parts: -1), and their calls
static OpCost sum_rows(const char* name, int part, long* calls) {
    OpCost s = {0, 0, 0, 0, 0};
    long n = 0;
    for (int i = 0; i < g_profile.nrows; i++) {
        const ProfileRow* r = &g_profile.rows[i];
        if ((name && strcmp(r->name, name) != 0) || (part >= 0 && r->part != part)) { continue; }
        s.flops += r->cost.flops;
        s.x_read += r->cost.x_read;
        s.x_written += r->cost.x_written;
        s.f_read += r->cost.f_read;
        s.f_written += r->cost.f_written;
        n += r->calls;
    }
    if (calls) { *calls = n; }
    return s;
}
static double written_bytes(const OpCost& c) { return sizeof(floatX) * c.x_written + 4.0 * c.f_written; }

int main() {
    GPT2Config cfg = {MAXT, V, padded_vocab(V), L, NH, C, 0, 0, 0, 0.0f, 0.0f};
    GPT2 model;
    gpt2_build(&model, &cfg);
    gpt2_init_random(&model, 7);
    gpt2_allocate_activations(&model, B, T);
    std::vector<int> in(B * T), tg(B * T);
    Rng rng;
    rng_init(&rng, 3);
    for (int i = 0; i < B * T; i++) { in[i] = (int)(rng_u32(&rng) % V); tg[i] = (int)(rng_u32(&rng) % V); }
    MicroBatch mb = {in.data(), tg.data(), NULL, B, T};

    g_profile.enabled = 1;
    g_ceilings.peak = 1e10;       // ridge point 1 FLOP/byte: the matmuls (~9) above it, AdamW (0.6) below
    g_ceilings.bandwidth = 1e10;
    for (int s = 0; s < STEPS; s++) {
        double t0 = wall_seconds();
        profile_step_begin(1);
        gpt2_zero_grad(&model);
        step_one_micro_batch(&model, &mb, 1.0f / (B * T));
        gpt2_update(&model, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f);
        profile_step_end(wall_seconds() - t0);
    }
    const double n = STEPS, BT = (double)B * T, Vp = cfg.padded_vocab_size, N = (double)model.num_parameters;

    // FLOPs
    double matmul_weights = Vp * C + L * 12.0 * C * C;   // the LM head (wte) and qkv, attproj, fc, fcproj per block
    long calls_f, calls_b;
    double mm = sum_rows("matmul", OP_FWD, &calls_f).flops + sum_rows("matmul", OP_BWD, &calls_b).flops;
    check_equal("matmul FLOPs = 6 x matmul weights x tokens", mm / n, 6.0 * matmul_weights * BT);
    double att = sum_rows("attention", -1, NULL).flops;
    check_equal("attention FLOPs = 12 L C T x tokens", att / n, 12.0 * L * C * T * BT);
    check_equal("matmul + attention = gpt2_flops_per_token - 6 x other params", (mm + att) / n,
                gpt2_flops_per_token(&model, T) * BT - 6.0 * (N - matmul_weights) * BT);

    // bytes
    double fwd_written = 0.0;
    for (int i = 0; i < g_profile.nrows; i++) {
        const ProfileRow* r = &g_profile.rows[i];
        if (r->part == OP_FWD && strcmp(r->name, "classifier") != 0) { fwd_written += written_bytes(r->cost); }
    }
    ActivationFormula af = gpt2_activation_formula(&model, B, T, 1);
    check_equal("forward writes the kept activations (formula per slot - 16 B T)", fwd_written / n,
                (double)af.per_slot - 16.0 * B * T);
    check_equal("classifier writes losses and dlogits", written_bytes(sum_rows("classifier", OP_FWD, NULL)) / n,
                4.0 * BT + sizeof(floatX) * BT * Vp);
    check_equal("AdamW moves 28 bytes a parameter", profile_bytes(&g_profile.rows[profile_row("adamw", OP_UPD, 0, 0)].cost) / n,
                28.0 * N);
    check_equal("zeroing the gradients writes them once", written_bytes(sum_rows("zero grad", OP_UPD, NULL)) / n,
                sizeof(floatX) * N);
    check_equal("their norm reads them once", sizeof(floatX) * sum_rows("global norm", OP_UPD, NULL).x_read / n,
                sizeof(floatX) * N);

    // calls
    int tensors = 0;   // AdamW runs once per tensor that has parameters (the MoE ones are empty here)
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { tensors += model.param_info[i].numel > 0; }
    struct { const char* name; int part; double per_step; } calls[] = {
        {"matmul", OP_FWD, 4.0 * L + 1}, {"matmul", OP_BWD, 4.0 * L + 1}, {"layernorm", OP_FWD, 2.0 * L + 1},
        {"layernorm", OP_BWD, 2.0 * L + 1}, {"attention", OP_FWD, L}, {"attention", OP_BWD, L}, {"gelu", OP_FWD, L},
        {"gelu", OP_BWD, L}, {"residual", OP_FWD, 2.0 * L}, {"encoder", OP_FWD, 1}, {"encoder", OP_BWD, 1},
        {"classifier", OP_FWD, 1}, {"zero grad", OP_UPD, 1}, {"global norm", OP_UPD, 1},
        {"adamw", OP_UPD, (double)tensors}};
    for (auto& c : calls) {
        long k;
        sum_rows(c.name, c.part, &k);
        std::string what = std::string("calls per step: ") + c.name + (c.part == OP_FWD ? " forward" : c.part == OP_BWD ? " backward" : "");
        check_equal(what.c_str(), k / n, c.per_step);
    }

    // time
    ProfileTotals t = profile_totals();
    report("the rows' time fits inside the step (no scope counted twice)", t.ops > 0 && t.ops <= t.step, t.ops, t.step);
    report("every row has a positive roofline bound", t.bound > 0, t.bound, 0);
    // the bound is the larger of the two times: the LM head's matmul compute-bound, AdamW memory-bound
    const OpCost* head = &g_profile.rows[profile_row("matmul", OP_FWD, C, (int)Vp)].cost;
    const OpCost* adam = &g_profile.rows[profile_row("adamw", OP_UPD, 0, 0)].cost;
    check_equal("bound of the LM head = FLOPs / peak", profile_bound_seconds(head), head->flops / g_ceilings.peak);
    check_equal("bound of AdamW = bytes / bandwidth", profile_bound_seconds(adam), profile_bytes(adam) / g_ceilings.bandwidth);
    printf("%s\n", failures ? "profile accounting FAILED" : "profile accounting passed");
    gpt2_free(&model);
    return failures ? 1 : 0;
}
