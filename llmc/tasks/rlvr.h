// RL with verifiable rewards (llmc/tasks/rlvr_rollouts.h): each step samples G completions per prompt with the
// KV cache (llmc/model/generate.h), scores them with the reward function, turns rewards into
// advantages, and trains on the rollouts with per-token loss weights -A: the policy gradient
// -A(r) * log p(Y), plus beta * KL against a frozen copy of the starting model (--kl). A rank
// rolls out its share of the rows; rewards are gathered over the data-parallel ranks for the
// group statistics. The rollouts are this step's micro-batches; the validation loss is
// pre-training's, on the token shards.
#pragma once

#include "task.h"
#include "rlvr_rollouts.h"

typedef struct {
    RLState rl;
    GPT2 ref_model;
    DataLoader val;
    int rows;                 // this rank's rollouts per step
    double rollout_seconds;
} RLVRTask;

static inline void rlvr_describe(Task* t) {
    RLVRTask* r = (RLVRTask*)t->self;
    const TrainArgs* a = t->args;
    printf("task         rlvr: %d prompts x %d samples per step, %s advantages, reward '%s', KL coefficient %g\n",
           a->batch / a->group, a->group, a->rl_mode, a->reward, a->kl);
    printf("sampling     %s, at most %d new tokens, stop at newline or end-of-text; %zu prompts from %s\n",
           r->rl.gen.temperature == 0.0f ? "greedy (top-1)" : "temperature/top-k", a->max_new, r->rl.examples.size(),
           a->prompts);
}

static inline double rlvr_val_loss(Task* t, const char** what) {
    RLVRTask* r = (RLVRTask*)t->self;
    *what = "";
    return plan_sum(t->plan, validation_loss(&t->plan->step, t->model, &r->val, t->args->eval_batches)) / t->plan->ndp;
}

// sample, score, advantages, loss weights; the micro-steps then train on the rollouts
static inline float rlvr_begin_step(Task* t, int step) {
    RLVRTask* r = (RLVRTask*)t->self;
    RLState* rl = &r->rl;
    double t0 = wall_seconds();
    plan_full_model_begin(t->plan);
    rl_rollout(rl, t->model, step, t->args->batch, t->plan->dp_rank * r->rows, r->rows, t->eot, plan_gather_floats, t->plan);
    plan_full_model_end(t->plan);
    if (rl->bad_rewards > 0) {
        printf("warning: the reward function returned a non-finite value for %d of %d samples: counted as 0\n",
               rl->bad_rewards, t->args->batch);
    }
    int n = t->args->grad_accum, Tm = rl->rb.T;
    t->micro.resize(n);
    for (int i = 0; i < n; i++) {
        size_t off = (size_t)i * t->B * Tm;
        t->micro[i] = MicroBatch{rl->rb.inputs.data() + off, rl->rb.targets.data() + off, rl->weights.data() + off, t->B, Tm};
    }
    r->rollout_seconds = wall_seconds() - t0;
    return rl->num_tokens > 0 ? (float)t->plan->ndp / (float)rl->num_tokens : 0.0f;
}

// with a KL penalty the loss to print is the whole objective: policy-gradient term + beta * KL
static inline float rlvr_step_loss(Task* t, float loss) {
    RLVRTask* r = (RLVRTask*)t->self;
    return r->rl.beta > 0.0f ? (float)r->rl.loss : loss;
}

static inline void rlvr_report(Task* t, int step, float loss) {
    RLVRTask* r = (RLVRTask*)t->self;
    RLState* rl = &r->rl;
    printf("       rl | reward %.3f | accuracy %.1f%% | length %.2f | KL %.5f | rollout %.1f ms\n", rl->reward_mean,
           100.0 * rl->accuracy, rl->length_mean, rl->kl, r->rollout_seconds * 1e3);
    if (t->metrics) {
        fprintf(t->metrics, "%d,%.6f,%.6f,%.4f,%.6g,%.6g,", step, rl->reward_mean, rl->accuracy, rl->length_mean, rl->kl,
                loss);
        if (!isnan(t->heldout)) { fprintf(t->metrics, "%.6f", t->heldout); }
        fprintf(t->metrics, "\n");
        t->heldout = NAN;
    }
}

static inline void rlvr_free(Task* t) {
    RLVRTask* r = (RLVRTask*)t->self;
    dataloader_free(&r->val);
    kvcache_free(&r->rl.kv);
    if (r->rl.ref) { gpt2_free(r->rl.ref); }
    delete r;
}

// The rollouts of step s are drawn from streams seeded by (seed, s, row): no generator state to
// keep. What carries over between steps is the running-mean baseline (--rl-mode baseline).
static inline void rlvr_get_position(Task* t, Position* pos) {
    const Advantage* a = &((RLVRTask*)t->self)->rl.advantage;
    uint32_t bits;
    memcpy(&bits, &a->baseline, sizeof(bits));
    position_put(pos, "rl.baseline_bits", bits);
    position_put(pos, "rl.have_baseline", (unsigned long long)a->have_baseline);
}
static inline void rlvr_set_position(Task* t, const Position* pos, const char* where) {
    Advantage* a = &((RLVRTask*)t->self)->rl.advantage;
    uint32_t bits = (uint32_t)position_get(pos, "rl.baseline_bits", where);
    memcpy(&a->baseline, &bits, sizeof(bits));
    a->have_baseline = position_get_int(pos, "rl.have_baseline", where);
}

// prompts with their answers, the sampler, the KV cache, the frozen reference model
static inline void rlvr_init(Task* t) {
    RLVRTask* r = new RLVRTask();
    t->self = r;
    const TrainArgs* a = t->args;
    GPT2* model = t->model;
    const GPT2Config* cfg = &model->config;
    int T = t->T;
    dataloader_init(&r->val, a->val_data, t->B, T, t->plan->dp_rank, t->plan->ndp, cfg->vocab_size);
    RLState* rl = &r->rl;
    r->rows = a->batch / t->plan->ndp;
    rl->reward = reward_parse(a->reward);
    rl->advantage = Advantage{rl_mode_parse(a->rl_mode), 0.0f, 0};
    rl->beta = a->kl;
    rl->group = a->group;
    rl->t_multiple = model->place.sp ? model->place.tp : 1;
    rl->seed = (uint64_t)a->seed;
    int greedy = rl->advantage.mode == RL_TOP1;
    rl->gen = GenerateConfig{greedy ? 0.0f : a->temperature, greedy ? 1 : a->top_k, a->max_new, 1};
    rl->examples = sft_load_examples(a->prompts, t->eot, 0);
    if (rl->examples.empty()) { die("no (prompt, answer) examples in '%s' (python3 dev/data/arithmetic.py writes them)", a->prompts); }
    int longest = 0;
    for (const SFTExample& e : rl->examples) { longest = std::max(longest, (int)e.prompt.size()); }
    if (longest + a->max_new - 1 > T) {
        die("--seq %d is too short for the longest prompt (%d tokens) + --max-new %d - 1", T, longest, a->max_new);
    }
    int cache_T = std::min(cfg->max_seq_len, longest + a->max_new);
    kvcache_init(&rl->kv, model, r->rows, cache_T, r->rows * cache_T);
    rl->ref = NULL;
    if (rl->beta > 0.0f) {   // a frozen copy of the starting point
        // the same shard as the policy, computed by the same ops (tensor parallelism's, with its
        // collectives): at step 1 both give the same log p bit for bit, so p_ref / p = 1 exactly
        if (a->load) { gpt2_load_checkpoint_shard(&r->ref_model, a->load, &model->place); }
        else { gpt2_build_shard(&r->ref_model, cfg, &model->place); gpt2_init_random(&r->ref_model, (uint64_t)a->seed, a->init_std); }
        gpt2_allocate_activations(&r->ref_model, t->B, T);
        r->ref_model.ops = model->ops;
        rl->ref = &r->ref_model;
    }
    t->describe = rlvr_describe;
    t->val_loss = rlvr_val_loss;
    t->begin_step = rlvr_begin_step;
    t->step_loss = rlvr_step_loss;
    t->report = rlvr_report;
    t->free = rlvr_free;
    t->get_position = rlvr_get_position;
    t->set_position = rlvr_set_position;
}
