// The model's accounting: its memory and its compute in closed form, from the shapes alone (no
// allocation), and its line in the run's header. The planner (llmc/planner/cost_model.h) predicts
// with these, the memory tables (llmc/train/parallel_plan_report.h) print them beside what was allocated, and
// the allocation checks against gpt2_state_bytes before it asks for the memory
// (llmc/model/gpt2_build.h). Included by llmc/model/gpt2.h (it needs GPT2).
#pragma once

#include "gpt2_core.h"   // GPT2
#include "recompute.h"   // the --recompute modes
#include "moe_stats.h"   // moe_dropped

// This rank's parameters with their gradients, AdamW's two moments and (where floatX is narrower
// than fp32) the fp32 master copy, in bytes.
static inline double gpt2_state_bytes(const GPT2* model) {
    double n = (double)model->num_parameters;
    return n * (2.0 * sizeof(floatX) + 2.0 * sizeof(float) + (sizeof(floatX) < sizeof(float) ? sizeof(float) : 0));
}

// The activation bytes of `slots` slots of B x T tokens in closed form: the count in the lecture
// "Data Parallelism in LLM Training" (from Korthikanti et al. 2022: 34 sbh + 5 a s^2 b bytes per
// layer at 2 bytes a value) written for this code, with v bytes a value (sizeof(floatX): 4 on the
// CPU, 2 for CUDA's bf16), h = C, Ts the residual stream's tokens (T, or T/tp with SP), and S_att
// the attention op's state floats per layer (CPU: B NH/tp T^2, the probabilities; CUDA: B NH/tp T,
// the log-sum-exps):
//   one whole block  B Ts (6 v h + 16) + B T 12 v h/tp + 4 S_att
//     stream (6 h): ln1, attproj, residual2, ln2, fcproj, residual3; 16: 4 fp32 layernorm statistics
//     tp region (12 h/tp): qkv 3, atty 1, fch 4, fch_gelu 4
//   per layer kept   none: the whole block; selective: minus fch_gelu and the state,
//                    B T 4 v h/tp + 4 S_att; full: residual3 only, B Ts v h
//   scratch (once)   none: 0; selective: B T 4 v h/tp + 4 S_att; full: the whole block minus
//                    residual3 (the block's input and output are kept)
//   per slot         Ls layers kept + encoded, lnf + stats B Ts (2 v h + 8) + logits B T Vs v
//                    (the stage with the head) + losses, tokens, targets, weights 16 B T
//   backward         dresidual, dln B Ts 2 v h + datty, dqkv, dfch B T 8 v h/tp (one layer's)
typedef struct {
    size_t block, per_layer, scratch, per_slot, backward, total;
} ActivationFormula;

static inline ActivationFormula gpt2_activation_formula(const GPT2* m, int B, int T, int slots) {
    const GPT2Config* c = &m->config;
    size_t v = sizeof(floatX), h = (size_t)c->channels, tp = (size_t)m->place.tp, Ls = (size_t)gpt2_slot_layers(m);
    size_t b = (size_t)B, s = (size_t)T, Ts = (size_t)gpt2_place_stream_tokens(&m->place, T);
    size_t S = gpt2_attention_state_size(m, B, T);   // the attention op's own count (state_size)
    ActivationFormula f;
    f.block = b * Ts * (6 * v * h + 16) + b * s * 12 * v * h / tp + 4 * S;
    size_t again = b * s * 4 * v * h / tp + 4 * S;   // selective: fch_gelu and the attention state
    switch (m->recompute) {
        case RECOMPUTE_SELECTIVE: f.per_layer = f.block - again; f.scratch = again; break;
        case RECOMPUTE_FULL: f.per_layer = b * Ts * v * h; f.scratch = f.block - b * Ts * v * h; break;
        default: f.per_layer = f.block; f.scratch = 0; break;
    }
    f.per_slot = Ls * f.per_layer + b * Ts * (2 * v * h + 8) +
                 (m->place.has_head ? b * s * (size_t)gpt2_local_vocab(m) * v : 0) + 16 * b * s;
    f.backward = b * Ts * 2 * v * h + b * s * 8 * v * h / tp;
    f.total = (size_t)slots * f.per_slot + f.scratch + f.backward;
    return f;
}

// FLOPs of one training step per token (forward + backward = 3 x forward): 6 per parameter
// in the matmuls, plus attention's QK^T and AV, 12 * L * C * T (PaLM's estimate). The whole
// model's: a sharded rank does its share.
static inline double gpt2_flops_per_token(const GPT2* model, int T) {
    const GPT2Config* c = &model->config;
    double params = (double)model->num_parameters_full;
    if (gpt2_is_moe(c)) {   // a token runs through k of the E experts of an MoE block: count the active ones
        params -= (double)gpt2_moe_layers(c) * (c->num_experts - c->moe_topk) * (double)moe_expert_params(c, 1);
    }
    return 6.0 * params + 12.0 * c->num_layers * c->channels * (double)T;
}

// The (token, expert) pairs the MoE blocks' capacity dropped in the last forward on a slot
static inline size_t gpt2_moe_dropped(const GPT2* model, int slot) { return model->moe ? moe_dropped(model->moe, slot) : 0; }

// The run header's line of the model, and where tp does not divide Vp, how the shards pad the
// vocabulary (llmc/model/params_shard.h: tp_vocab_rows).
static inline void gpt2_print_shape(const GPT2* model) {
    const GPT2Config* cfg = &model->config;
    printf("model        L %d, NH %d, C %d, maxT %d, V %d (padded %d): %zu parameters", cfg->num_layers, cfg->num_heads,
           cfg->channels, cfg->max_seq_len, cfg->vocab_size, cfg->padded_vocab_size, model->num_parameters_full);
    if (model->num_parameters != model->num_parameters_full) { printf(", %zu in this rank's shard", model->num_parameters); }
    printf("\n");
    if (gpt2_run_vocab(model) != cfg->padded_vocab_size) {
        int Vr = gpt2_run_vocab(model), Vp = cfg->padded_vocab_size;
        printf("vocabulary   %d tokens padded to %d rows (%d x %d) so that --tp %d divides them: the %d rows past %d are "
               "zero and outside the loss; checkpoints and states keep %d\n", cfg->vocab_size, Vr, model->place.tp,
               gpt2_local_vocab(model), model->place.tp, Vr - Vp, Vp, Vp);
    }
}
