// The step: in what order the forward and backward pieces (llmc/model/gpt2.h) run over the
// micro-batches of one optimizer step. One of the three extension points of
// doc/architecture.md: a pipeline schedule replaces it (GPipe, 1F1B, ...), the ops and the
// placement hooks stay as they are.
//
// The default is gradient accumulation: the n micro-batches one after another, each one's
// forward, loss and backward on slot 0, gradients adding up (+=) before the one update:
//
//   micro 0: [F emb | F block 0 .. L-1 | F head + loss][B head | B block L-1 .. 0 | B emb]
//   micro 1: [F ...                                   ][B ...                          ]  ...
//
// A step gets its micro-batches from the task through `get` (MicroBatchSource) by index, so
// it may run them in any order, and it tells the placement hooks which of the n is starting
// (gpt2_micro_begin: data parallelism communicates on the last one). It returns the sum over
// micro-batches of (loss sum x dloss): the mean loss of this rank's share of the step.
#pragma once

#include "gpt2.h"
#include "../trace.h"

typedef struct {
    const int* inputs;     // host (B, T) token ids
    const int* targets;    // host (B, T)
    const float* weights;  // host (B, T) per-token loss weights, or NULL (every token weighs 1)
    int B, T;
} MicroBatch;

typedef struct {
    void* ctx;
    MicroBatch (*get)(void* ctx, int i);   // micro-batch i (0..n-1) of the current step
} MicroBatchSource;

typedef struct {
    const char* name;
    void* ctx;
    float (*run)(void* ctx, GPT2* model, const MicroBatchSource* batches, int n, float dloss);
    // forward only (evaluation): the sum over the batch's tokens of w_i * CE_i, on every rank
    // (NULL: step_forward_loss, the whole model on this rank)
    double (*loss)(void* ctx, GPT2* model, const MicroBatch* mb);
} GPT2Step;

// one micro-batch on slot 0: forward, loss (writing dlogits), backward
static inline float step_one_micro_batch(GPT2* model, const MicroBatch* mb, float dloss) {
    double tf = trace_now();
    gpt2_forward(model, mb->inputs, mb->B, mb->T);
    // the mean loss: dloss carries the loss scale S (llmc/train/loss_scale.h), the loss returned does not
    float loss = gpt2_classifier(model, mb->targets, mb->weights, dloss, 1) * (dloss / model->loss_scale);
    if (model->moe) { loss += gpt2_aux_loss(model, 0) / model->moe->micro_n; }   // the load-balancing loss, a mean over the step
    trace_event("forward", 0, tf);
    double tb = trace_now();
    gpt2_backward(model);
    trace_event("backward", 0, tb);
    return loss;
}

static inline float step_grad_accum_run(void* ctx, GPT2* model, const MicroBatchSource* batches, int n, float dloss) {
    (void)ctx;
    float loss = 0.0f;
    for (int i = 0; i < n; i++) {
        gpt2_micro_begin(model, i, n);
        MicroBatch mb = batches->get(batches->ctx, i);
        loss += step_one_micro_batch(model, &mb, dloss);
    }
    return loss;
}

static inline double step_forward_loss(void* ctx, GPT2* model, const MicroBatch* mb) {
    (void)ctx;
    gpt2_forward(model, mb->inputs, mb->B, mb->T);
    return gpt2_classifier(model, mb->targets, mb->weights, 0.0f, 0);
}

// the evaluation's forward through whichever step is in charge
static inline double step_loss(const GPT2Step* s, GPT2* model, const MicroBatch* mb) {
    return s->loss ? s->loss(s->ctx, model, mb) : step_forward_loss(NULL, model, mb);
}

static inline GPT2Step step_grad_accum(void) {
    GPT2Step s = {"gradient accumulation", NULL, step_grad_accum_run, step_forward_loss};
    return s;
}
