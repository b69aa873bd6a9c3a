// The tasks by name (--task), and what every task sets up the same way: the tokenizer, the
// held-out examples for the exact-match accuracy, the metrics file. A new task is a file in
// llmc/tasks/ with an init function, and one line in TASKS below.
#pragma once

#include "task.h"
#include "pretrain.h"
#include "sft.h"
#include "rlvr.h"

static const struct { const char* name; void (*init)(Task* t); } TASKS[] = {
    {"pretrain", pretrain_init},
    {"sft", sft_init},
    {"rlvr", rlvr_init},
};

static inline void task_init(Task* t, GPT2* model, Plan* plan, const TrainArgs* a, int B, int T) {
    t->name = a->task;
    t->model = model;
    t->plan = plan;
    t->args = a;
    t->B = B;
    t->T = T;
    t->eot = model->config.vocab_size - 1;
    t->have_tokenizer = 0;
    t->metrics = NULL;
    t->heldout = NAN;
    if (!a->bench) {
        struct stat st;
        if (a->tokenizer && stat(a->tokenizer, &st) == 0) {   // (a pipe or a directory: tokenizer_load names it)
            tokenizer_load(&t->tokenizer, a->tokenizer);
            if (t->tokenizer.vocab_size != model->config.vocab_size) {
                die("tokenizer '%s' has %d tokens but the model's vocabulary is %d", a->tokenizer,
                    t->tokenizer.vocab_size, model->config.vocab_size);
            }
            t->have_tokenizer = 1;
            t->eot = t->tokenizer.eot_token;
        } else {
            printf("note: no tokenizer at '%s': samples print token ids\n", a->tokenizer ? a->tokenizer : "");
        }
    }
    int found = 0;
    for (const auto& task : TASKS) {
        if (strcmp(task.name, a->task) == 0) { task.init(t); found = 1; }
    }
    if (!found) { die("--task must be pretrain, sft or rlvr, got '%s'", a->task); }
    if (a->accuracy > 0 && !a->bench && !plan_whole_model(plan)) {
        printf("note: no exact-match accuracy with --pp, --cp or --ep: greedy generation runs the whole model on whole sequences on one rank\n");
    } else if (a->accuracy > 0 && !a->bench) {
        if (model->config.vocab_size == 257) { t->examples = arith_load_examples(a->val_data, t->eot, a->accuracy); }
        if (t->examples.empty()) {
            printf("note: no exact-match accuracy: it needs byte-level 'a+b=c' validation data (dev/data/arithmetic.py)\n");
        }
        for (size_t i = 0; i < t->examples.size(); i++) {
            if ((int)(i % plan->ndp) == plan->dp_rank) { t->my_examples.push_back(t->examples[i]); }
        }
    }
}

// Before step `step` (and after the last): evaluation every --eval-every steps and at the end,
// samples every --sample-every, a checkpoint every --save-every, on the whole model (ZeRO-3
// gathers the parameters).
static inline void task_between_steps(Task* t, int step, int last, Rng* sample_rng) {
    const TrainArgs* a = t->args;
    int do_eval = !a->bench && (last || (a->eval_every > 0 && step % a->eval_every == 0));
    int do_sample = !a->bench && a->sample_every > 0 && (step % a->sample_every == 0 || last) && step > 0;
    int do_save = a->save && a->save_every > 0 && step > 0 && step % a->save_every == 0 && !last;
    if (!do_eval && !do_sample && !do_save) { return; }
    plan_full_model_begin(t->plan);
    if (do_eval) { task_evaluate(t, step, last); }   // each rank its share; sums combined
    if (do_sample && plan_samples(t->plan)) { task_print_sample(t, sample_rng); }   // rank 0 prints
    if (do_save) {
        plan_save_checkpoint(t->plan, a->save);
        printf("saved %s (step %d)\n", a->save, step);
    }
    plan_full_model_end(t->plan);
}

// after the header is printed: the metrics file (rank 0)
static inline void task_open_metrics(Task* t) {
    if (t->args->metrics && t->plan->rank == 0) {
        t->metrics = fopen_tmp_for_write(t->args->metrics, &t->metrics_tmp);
        fprintf(t->metrics, "step,reward,accuracy,length,kl,loss,heldout_accuracy\n");
    }
}

static inline void task_free(Task* t) {
    if (t->metrics) { fclose_and_rename(t->metrics, t->metrics_tmp, t->args->metrics); }
    t->free(t);
    if (t->have_tokenizer) { tokenizer_free(&t->tokenizer); }
}
