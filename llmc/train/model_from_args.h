// The model the flags ask for: its shape (gpt2_config_from_args: a checkpoint's with --load, or a
// preset's, --model, with --layers/--heads/... overrides; every check of them), and the model
// itself (gpt2_from_args), built as the shard this rank holds. The planner needs only the shape.
#pragma once

#include "../plan/train_args.h"
#include "../model/gpt2.h"
#include "../model/checkpoint.h"

// Which shard of the model this rank holds (the plan's plan_place: the whole model until tensor,
// pipeline or expert parallelism split it), asked once the shape is known
typedef GPT2Place (*PlaceFn)(void* ctx, const GPT2Config* cfg);

// *version: the checkpoint's format (0 for a preset)
static inline GPT2Config gpt2_config_from_args(const TrainArgs* a, int* version) {
    if (a->load) {
        if (a->layers || a->heads || a->channels || a->max_seq || a->vocab) {
            die("--load takes the model's shape from the checkpoint: drop --layers/--heads/--channels/--max-seq/--vocab");
        }
        GPT2Config c = gpt2_read_checkpoint_config(a->load, version);
        const char* moe_flags[] = {"moe-topk", "moe-every", "moe-capacity", "moe-aux"};
        for (const char* f : moe_flags) {
            if (!gpt2_is_moe(&c) && args_given(f)) {
                die("--load '%s' is a dense checkpoint (version %d): --%s does nothing; drop it", a->load, *version, f);
            }
        }
        if (a->moe_experts > 0 && !gpt2_is_moe(&c)) {
            die("--load '%s' is a dense checkpoint (version %d): --moe-experts %d does not apply; drop it, or start a new MoE "
                "model with --model", a->load, *version, a->moe_experts);
        }
        if (a->moe_experts > 0 && (a->moe_experts != c.num_experts || a->moe_topk != c.moe_topk || a->moe_every != c.moe_every)) {
            die("--load '%s' holds %d experts, top-%d, every %d blocks: --moe-experts %d --moe-topk %d --moe-every %d do not "
                "match (drop them to take the file's)", a->load, c.num_experts, c.moe_topk, c.moe_every, a->moe_experts,
                a->moe_topk, a->moe_every);
        }
        if (gpt2_is_moe(&c) && a->moe_capacity > 0.0f) { c.moe_capacity = a->moe_capacity; }   // given: the run's setting
        if (gpt2_is_moe(&c) && a->moe_aux >= 0.0f) { c.moe_aux = a->moe_aux; }
        if (a->ep > 1 && !gpt2_is_moe(&c)) { die("--ep %d: '%s' is a dense model, it has no experts to split", a->ep, a->load); }
        if (a->ep > 1 && c.num_experts % a->ep != 0) {
            die("--ep %d does not divide the %d experts of '%s'", a->ep, c.num_experts, a->load);
        }
        return c;
    }
    *version = 0;
    GPT2Config cfg;
    if (!gpt2_config_preset(a->model, &cfg)) {
        die("unknown --model '%s' (expected tiny, gpt2, gpt2-medium, gpt2-large or gpt2-xl)", a->model);
    }
    if (a->layers) { cfg.num_layers = a->layers; }
    if (a->heads) { cfg.num_heads = a->heads; }
    if (a->channels) { cfg.channels = a->channels; }
    if (a->max_seq) { cfg.max_seq_len = a->max_seq; }
    if (a->vocab) { cfg.vocab_size = a->vocab; cfg.padded_vocab_size = padded_vocab(a->vocab); }
    if (a->moe_experts > 0) {
        cfg.num_experts = a->moe_experts;
        cfg.moe_topk = a->moe_topk;
        cfg.moe_every = a->moe_every;
        cfg.moe_capacity = a->moe_capacity > 0.0f ? a->moe_capacity : 1.25f;
        cfg.moe_aux = a->moe_aux >= 0.0f ? a->moe_aux : 0.01f;
    } else if (a->ep > 1) {
        die("--ep %d splits the experts of a mixture of experts: add --moe-experts E", a->ep);
    }
    gpt2_check_config(&cfg);
    return cfg;
}

// The shard `place` names: read from the checkpoint (--load), or a preset's initialised from --seed
static inline void gpt2_from_args(GPT2* model, const TrainArgs* a, PlaceFn place, void* ctx) {
    int version;
    GPT2Config cfg = gpt2_config_from_args(a, &version);
    GPT2Place p = place(ctx, &cfg);
    if (a->load) {
        gpt2_load_checkpoint_config(model, a->load, &p, &cfg, version);
        return;
    }
    gpt2_build_shard(model, &cfg, &p);
    gpt2_init_random(model, (uint64_t)a->seed, a->init_std);
}
