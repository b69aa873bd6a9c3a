// Supervised fine-tuning: cross-entropy on the answer tokens only. The rows are packed
// (prompt, answer) examples with a loss mask (llmc/data/sft_shards.h); the mask is the per-token loss
// weight. The loss is a mean over the answer tokens of the whole step (all ranks, all
// micro-steps): every rank counts them in the packed rows ahead (sft_loader_count_ahead), no
// communication needed, so dloss = (data-parallel ranks) / (answer tokens in the step).
#pragma once

#include "task.h"
#include "../data/sft_shards.h"

typedef struct {
    SFTLoader train, val;
    std::vector<std::vector<int>> inputs, targets;
    std::vector<std::vector<float>> weights;
} SFTTask;

static inline void sft_describe(Task* t) {
    SFTTask* s = (SFTTask*)t->self;
    printf("task         sft: cross-entropy on the answer tokens only\n");
    printf("data         %s: %ld examples packed into %ld rows of %d tokens, %ld skipped (longer than %d tokens)\n",
           t->args->sft_train, s->train.num_examples, s->train.num_rows, t->T + 1, s->train.num_skipped, t->T + 1);
    printf("order        %s\n", t->args->shuffle ? "rows shuffled once (seeded by --seed)" : "file order");
}

// the answer-token loss on the validation examples: each rank sums CE over its answer tokens
// and counts them; the sums are combined over ranks
static inline double sft_val_loss(Task* t, const char** what) {
    SFTTask* s = (SFTTask*)t->self;
    SFTLoader* val = &s->val;
    sft_loader_reset(val);
    double sum = 0.0, count = 0.0;
    for (int i = 0; i < t->args->eval_batches; i++) {
        sft_loader_next_batch(val);
        MicroBatch mb = {val->inputs, val->targets, val->weights, val->B, val->T};
        sum += step_loss(&t->plan->step, t->model, &mb);
        for (int j = 0; j < val->B * val->T; j++) { count += val->weights[j]; }
    }
    *what = " (answer tokens)";
    // sum: this rank's tokens (its part of each sequence with --cp); count: the whole batch's
    return (float)(plan_sum(t->plan, sum) / std::max(1.0, plan_sum_batches(t->plan, count)));
}

static inline float sft_begin_step(Task* t, int step) {
    (void)step;
    SFTTask* s = (SFTTask*)t->self;
    int n = t->args->grad_accum;
    size_t BT = (size_t)t->B * t->T;
    long answers = sft_loader_count_ahead(&s->train, n);
    s->inputs.resize(n);
    s->targets.resize(n);
    s->weights.resize(n);
    t->micro.resize(n);
    for (int i = 0; i < n; i++) {
        sft_loader_next_batch(&s->train);
        s->inputs[i].assign(s->train.inputs, s->train.inputs + BT);
        s->targets[i].assign(s->train.targets, s->train.targets + BT);
        s->weights[i].assign(s->train.weights, s->train.weights + BT);
        t->micro[i] = MicroBatch{s->inputs[i].data(), s->targets[i].data(), s->weights[i].data(), t->B, t->T};
    }
    return answers > 0 ? (float)t->plan->ndp / (float)answers : 0.0f;
}

static inline void sft_free(Task* t) {
    SFTTask* s = (SFTTask*)t->self;
    sft_loader_free(&s->train);
    sft_loader_free(&s->val);
    delete s;
}

static inline void sft_get_position(Task* t, Position* pos) {
    position_put(pos, "data.next_row", (unsigned long long)((SFTTask*)t->self)->train.next_row);
}
static inline void sft_set_position(Task* t, const Position* pos, const char* where) {
    SFTLoader* dl = &((SFTTask*)t->self)->train;
    unsigned long long row = position_get(pos, "data.next_row", where);
    if (row > (unsigned long long)dl->num_rows) {
        die("'%s': the data position is row %llu, but '%s' packs into %ld rows now", where, row, t->args->sft_train, dl->num_rows);
    }
    dl->next_row = (long)row;
    // where the step's micro-batches from row 0 end (sft_loader_next_batch's walk)
    unsigned long long k = position_get(pos, "trainer.step", where) * (unsigned long long)t->args->grad_accum;
    long want = 0;
    for (unsigned long long i = 0; i < k; i++) { want = sft_batch_start(dl, want) + (long)dl->nranks * dl->B; }
    if ((long)row != want) {
        die("'%s': the data position is row %llu, but %llu micro-batches of %ld rows from row 0 of '%s' end at row %ld: the "
            "file was edited, or the pattern matches other examples than the saved run's", where, row, k, (long)dl->nranks * dl->B,
            t->args->sft_train, want);
    }
}

static inline void sft_init(Task* t) {
    if (t->args->bench) { die("--bench times pre-training steps: drop --task sft"); }
    SFTTask* s = new SFTTask();
    t->self = s;
    Plan* plan = t->plan;
    int V = t->model->config.vocab_size;
    sft_loader_init(&s->train, t->args->sft_train, t->B, t->T, plan->dp_rank, plan->ndp, V, t->eot);
    if (t->args->shuffle) { sft_loader_shuffle(&s->train, (uint64_t)t->args->seed); }
    sft_loader_init(&s->val, t->args->sft_val, t->B, t->T, plan->dp_rank, plan->ndp, V, t->eot);
    t->describe = sft_describe;
    t->val_loss = sft_val_loss;
    t->begin_step = sft_begin_step;
    t->step_loss = task_identity_loss;
    t->report = task_no_report;
    t->free = sft_free;
    t->get_position = sft_get_position;
    t->set_position = sft_set_position;
}
