// A training task: where a step's tokens and per-token loss weights come from, how the model
// is evaluated, and what is reported after each step (doc/training-tasks.md). The trainer
// (train_gpt2.cu) knows only this interface; each task is one file under llmc/tasks/:
//   pretrain  [X] -> model -> [X_log]: cross-entropy on every next token (llmc/data/token_shards.h)
//   sft       [X, Y] -> model -> [X_log, Y_log]: cross-entropy on the answer tokens Y only
//   rlvr      [X] -> model -> sampled Y -> reward r: policy gradient -A(r) * log p(Y)
//
// One optimizer step asks the task, in this order:
//   begin_step(step)  -> dloss: fetch (or generate) this step's n micro-batches, return the
//                      loss scale that makes the sum over micro-batches and ranks a mean
//   micro[i]          the micro-batches (host arrays), read by the step (llmc/model/step.h) in any order
//   step_loss(loss)   the loss to print (RLVR with a KL penalty prints its own objective)
//   report(step)      lines after the step line (RLVR: reward, accuracy, ...; its metrics file)
// and, every --eval-every steps, val_loss (combined over ranks) for task_evaluate, which adds
// the exact-match accuracy on held-out arithmetic examples, whatever the task.
#pragma once

#include <map>
#include <string>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../data/tokenizer.h"
#include "eval.h"
#include "../model/step.h"
#include "../plan/log.h"
#include "../plan/train_args.h"
#include "../plan/parallel_plan.h"

// Where a run stands, as text key -> value: what the training state (llmc/train/train_state.h)
// saves besides the tensors, and gives back on --resume. Every value is the same on every rank
// (the data loaders' positions are global, the RL baseline is computed from gathered rewards),
// so rank 0 writes it once.
typedef std::map<std::string, std::string> Position;
static inline void position_put(Position* p, const char* key, unsigned long long v) { (*p)[key] = std::to_string(v); }
static inline unsigned long long position_get(const Position* p, const char* key, const char* where) {
    auto it = p->find(key);
    if (it == p->end()) { die("'%s' has no '%s': it was saved by another task or version", where, key); }
    const std::string& s = it->second;
    errno = 0;
    unsigned long long v = strtoull(s.c_str(), NULL, 10);   // digits only: strtoull alone takes "-1" as 2^64 - 1
    if (s.empty() || strspn(s.c_str(), "0123456789") != s.size() || errno == ERANGE) {
        die("'%s': '%s' holds '%s', expected a whole number of at most 20 digits", where, key, s.c_str());
    }
    return v;
}
static inline int position_get_int(const Position* p, const char* key, const char* where) {
    unsigned long long v = position_get(p, key, where);
    if (v > 2147483647ULL) { die("'%s': '%s' holds %llu, more than an int holds (at most 2147483647)", where, key, v); }
    return (int)v;
}

typedef struct Task {
    const char* name;
    // what every task shares
    GPT2* model;
    Plan* plan;
    const TrainArgs* args;
    int B, T;                                  // this rank's micro-batch
    int eot;
    Tokenizer tokenizer;
    int have_tokenizer;
    std::vector<ArithExample> examples, my_examples;   // held-out examples; this rank's share
    FILE* metrics;                             // --metrics CSV (rank 0), or NULL
    std::string metrics_tmp;
    float heldout;                             // the last held-out accuracy (NAN: none since the last report)
    std::vector<MicroBatch> micro;             // this step's micro-batches
    void* self;                                // the task's own state
    // the interface
    void (*describe)(struct Task* t);
    double (*val_loss)(struct Task* t, const char** what);
    float (*begin_step)(struct Task* t, int step);
    float (*step_loss)(struct Task* t, float loss);
    void (*report)(struct Task* t, int step, float loss);
    void (*free)(struct Task* t);
    // the training state: where the task's data stands (save), and back there (resume)
    void (*get_position)(struct Task* t, Position* p);
    void (*set_position)(struct Task* t, const Position* p, const char* where);
    // optional: what is wrong with the data the next step would read, "" when nothing (pretrain: big shards)
    std::string (*look_ahead)(struct Task* t);
} Task;

static inline MicroBatch task_micro_batch(void* ctx, int i) { return ((Task*)ctx)->micro[i]; }
static inline MicroBatchSource task_batches(Task* t) {
    MicroBatchSource s = {t, task_micro_batch};
    return s;
}

// ---- shared by the tasks

// mean cross-entropy per token over `batches` batches of a token-shard loader, through the
// plan's step (a pipeline runs the forward stage by stage)
static inline float validation_loss(const GPT2Step* step, GPT2* model, DataLoader* val, int batches) {
    dataloader_reset(val);
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(val);
        MicroBatch mb = {val->inputs, val->targets, NULL, val->B, val->T};
        sum += step_loss(step, model, &mb) / ((double)val->B * val->T);
    }
    return (float)(sum / batches);
}

// Validation loss (the task's), then the exact-match accuracy on the held-out examples.
static inline void task_evaluate(Task* t, int step, int last) {
    const char* what = "";
    float val_loss = (float)t->val_loss(t, &what);
    if (t->examples.empty()) {
        printf("val loss%s %.4f\n", what, val_loss);
        return;
    }
    if (last) { printf("held-out examples, greedy completion:\n"); }
    float mine = t->my_examples.empty() ? 0.0f : arith_accuracy(t->model, t->my_examples, t->eot, last ? 8 : 0);
    float acc = (float)(plan_sum(t->plan, (double)mine * t->my_examples.size()) / t->examples.size());
    printf("val loss%s %.4f | accuracy %.1f%% (exact match, %d held-out examples)\n", what, val_loss, 100.0f * acc,
           (int)t->examples.size());
    t->heldout = acc;
    if (t->metrics && last) { fprintf(t->metrics, "%d,,,,,,%.6f\n", step, acc); }
}

// One sample of `len` tokens from end-of-text, decoded to text. Unlike generate() it does not
// stop at end-of-text or a newline (a sample shows several documents), so it drives the KV
// cache itself: one token per call, each attending over the keys and values cached so far.
static inline void task_print_sample(Task* t, Rng* rng) {
    GPT2* model = t->model;
    const TrainArgs* a = t->args;
    std::vector<float> logits(gpt2_run_vocab(model));   // a whole row: tp x the local vocabulary
    int len = std::min(std::min(a->sample_len, t->T - 1), model->config.max_seq_len - 1);
    if (len <= 0) { return; }
    KVCache kv;
    kvcache_init(&kv, model, 1, len, 1);   // one row; the last sampled token is never fed back
    int token = t->eot, row = 0;
    printf("sample: ");
    for (int pos = 0; pos < len; pos++) {
        gpt2_forward_cached(model, &kv, &token, &row, &pos, 1);
        kvcache_logits_to_host(model, &kv, 0, logits.data());
        token = sample_top_k(logits.data(), model->config.vocab_size, a->top_k, a->temperature, rng);
        if (t->have_tokenizer) { tokenizer_print(&t->tokenizer, token); } else { printf("%d ", token); }
    }
    printf("\n---\n");
    kvcache_free(&kv);
}

static inline float task_identity_loss(Task* t, float loss) { (void)t; return loss; }
static inline void task_no_report(Task* t, int step, float loss) { (void)t; (void)step; (void)loss; }
