// Pre-training: cross-entropy on every next token of the token shards (llmc/data/token_shards.h). A step
// reads n micro-batches of B x T tokens (this rank's share; the ranks read disjoint rows), or
// with --bench random tokens and no files. dloss = 1 / (this rank's tokens in the step's
// micro-batch): data parallelism averages the ranks' gradients, so the update follows the mean
// over the global batch.
#pragma once

#include "task.h"

typedef struct {
    DataLoader train, val;
    Rng bench_rng;
    std::vector<std::vector<int>> inputs, targets;   // this step's micro-batches
} PretrainTask;

static inline void pretrain_describe(Task* t) {
    printf("task         pretrain: cross-entropy on every next token\n");
    printf("data         %s\n", t->args->bench ? "random tokens (--bench)" : t->args->train_data);
}

static inline double pretrain_val_loss(Task* t, const char** what) {
    PretrainTask* p = (PretrainTask*)t->self;
    *what = "";
    return plan_sum(t->plan, validation_loss(&t->plan->step, t->model, &p->val, t->args->eval_batches)) / t->plan->ndp;
}

static inline float pretrain_begin_step(Task* t, int step) {
    (void)step;
    PretrainTask* p = (PretrainTask*)t->self;
    int n = t->args->grad_accum, B = t->B, T = t->T;
    size_t BT = (size_t)B * T;
    p->inputs.resize(n);
    p->targets.resize(n);
    t->micro.resize(n);
    for (int i = 0; i < n; i++) {
        if (t->args->bench) {
            std::vector<int> tokens(BT + 1);
            for (auto& x : tokens) { x = (int)(rng_u32(&p->bench_rng) % t->model->config.vocab_size); }
            p->inputs[i].assign(tokens.begin(), tokens.end() - 1);
            p->targets[i].assign(tokens.begin() + 1, tokens.end());
        } else {
            dataloader_next_batch(&p->train);
            p->inputs[i].assign(p->train.inputs, p->train.inputs + BT);
            p->targets[i].assign(p->train.targets, p->train.targets + BT);
        }
        t->micro[i] = MicroBatch{p->inputs[i].data(), p->targets[i].data(), NULL, B, T};
    }
    return 1.0f / ((float)(t->args->batch / t->plan->ndp) * T);
}

static inline std::string pretrain_look_ahead(Task* t) {
    return t->args->bench ? "" : dataloader_look_ahead(&((PretrainTask*)t->self)->train, t->args->grad_accum);
}

static inline void pretrain_free(Task* t) {
    PretrainTask* p = (PretrainTask*)t->self;
    if (!t->args->bench) { dataloader_free(&p->train); dataloader_free(&p->val); }
    delete p;
}

static inline void pretrain_get_position(Task* t, Position* pos) {
    PretrainTask* p = (PretrainTask*)t->self;
    position_put(pos, "data.shard", t->args->bench ? 0 : (unsigned long long)p->train.shard);
    position_put(pos, "data.pos", t->args->bench ? 0 : p->train.pos);
    position_put(pos, "data.bench_rng", p->bench_rng.state);
}
static inline void pretrain_set_position(Task* t, const Position* pos, const char* where) {
    PretrainTask* p = (PretrainTask*)t->self;
    p->bench_rng.state = position_get(pos, "data.bench_rng", where);
    if (!t->args->bench) {
        size_t shard = position_get(pos, "data.shard", where), at = position_get(pos, "data.pos", where);
        dataloader_seek(&p->train, shard, at, where);
        // where the step's micro-batches from the start of these shards end (dataloader_next_batch's walk)
        unsigned long long k = position_get(pos, "trainer.step", where) * (unsigned long long)t->args->grad_accum;
        size_t want_shard = 0, want = 0, global = (size_t)p->train.nranks * p->train.B * p->train.T, n = p->train.files.gl_pathc;
        std::vector<size_t> tokens(n);
        for (size_t i = 0; i < n; i++) { FILE* f; tokens[i] = shard_check(p->train.files.gl_pathv[i], &f); fclose(f); }
        for (unsigned long long i = 0; i < k; i++) {
            if (want + global + 1 > tokens[want_shard]) { want_shard = (want_shard + 1) % n; want = 0; }
            want += global;
        }
        if (shard != want_shard || at != want) {
            die("'%s': the data position is shard %zu token %zu, but %llu micro-batches of %zu tokens from the start of "
                "'%s' end at shard %zu token %zu: the file was edited, or the pattern matches other shards than the saved run's",
                where, shard, at, k, global, t->args->train_data, want_shard, want);
        }
    }
}

static inline void pretrain_init(Task* t) {
    PretrainTask* p = new PretrainTask();
    t->self = p;
    rng_init(&p->bench_rng, (uint64_t)t->args->seed + 2);
    if (!t->args->bench) {
        Plan* plan = t->plan;
        dataloader_init(&p->train, t->args->train_data, t->B, t->T, plan->dp_rank, plan->ndp, t->model->config.vocab_size);
        dataloader_init(&p->val, t->args->val_data, t->B, t->T, plan->dp_rank, plan->ndp, t->model->config.vocab_size);
    }
    t->describe = pretrain_describe;
    t->val_loss = pretrain_val_loss;
    t->begin_step = pretrain_begin_step;
    t->step_loss = task_identity_loss;
    t->report = task_no_report;
    t->free = pretrain_free;
    t->get_position = pretrain_get_position;
    t->set_position = pretrain_set_position;
    t->look_ahead = pretrain_look_ahead;
}
