// The placement hooks: WHERE weights and gradients live and WHEN they are ready, like
// PyTorch's module hooks. One of the three extension points of doc/architecture.md (the others:
// the ops of llmc/model/ops.h, how a sublayer is computed; the step of llmc/model/step.h, the order of the
// passes). The passes (llmc/model/gpt2.h) raise the events; data parallelism's modes
// (llmc/parallel/dp_*.h) install tables of hooks that answer them:
//
//   micro_begin(i, n)             the i-th of the step's n micro-batches starts (in run order):
//                                 DDP communicates only on the last
//   forward_begin(root)           before the embedding: ZeRO-3 gathers the root tensors
//   block_forward_begin(l, w)     block l's weights: ZeRO-3 points w into the gathered bucket
//   block_forward_end(l)          ZeRO-3 frees the gathered block
//   backward_begin(root, grads)   the root's gradients: the buckets point them into theirs
//   block_backward_begin(l, w, g) block l's weights and gradients (gathered / in a bucket)
//   block_backward_end(l)         block l's gradients are complete: DDP starts the bucket's
//                                 all-reduce, ZeRO its reduce-scatter, while the backward goes on
//   backward_end                  the root's gradients are complete (wte: after the embedding)
//
// `root` holds the tensors outside the blocks (the embedding's and the head's; the other fields
// of ParameterTensors are unused). Several tables chain: "begin" events run in installation
// order and "end" events in reverse, as nested scopes, and each may rewrite the pointers the
// one before left. A NULL entry is skipped.
#pragma once

#include <atomic>
#include "../common.h"
#include "params.h"

typedef struct {
    const char* name;
    void* ctx;
    void (*micro_begin)(void* ctx, int i, int n);
    void (*forward_begin)(void* ctx, ParameterTensors* root);
    void (*block_forward_begin)(void* ctx, int l, BlockWeights* w);
    void (*block_forward_end)(void* ctx, int l);
    void (*backward_begin)(void* ctx, ParameterTensors* root, ParameterTensors* root_grads);
    void (*block_backward_begin)(void* ctx, int l, BlockWeights* w, BlockWeights* grads);
    void (*block_backward_end)(void* ctx, int l);
    void (*backward_end)(void* ctx);
} GPT2Hooks;

#define HOOK_CHAIN_MAX 6

// Progress through the events, for the watchdog (llmc/train/guard.h, --comm-timeout), which reads
// it from its own thread: the events so far (the two block ends not counted) and the last one,
// kind << 32 | micro-batch << 16 | block. Counted once the tables have run: a rank that stops
// inside one (a gather that never returns) has not passed the event.
enum { HOOK_MICRO = 1, HOOK_FORWARD, HOOK_BLOCK_FORWARD, HOOK_BACKWARD, HOOK_BLOCK_BACKWARD, HOOK_BACKWARD_END };
typedef struct {
    std::atomic<long long> events{0}, where{0};
    std::atomic<double> at{0.0};   // wall_seconds() of the last event (or of the guard's step mark)
} HookProgress;

typedef struct {
    GPT2Hooks tables[HOOK_CHAIN_MAX];
    int n;
    HookProgress* progress;   // NULL: no watchdog
    int micro;                // the micro-batch the passes are in
} HookChain;

static inline void hooks_progress(HookChain* c, int kind, int l) {
    c->progress->where.store(((long long)kind << 32) | ((long long)(c->micro & 0xFFFF) << 16) | (long long)(l & 0xFFFF));
    c->progress->events.fetch_add(1);
    c->progress->at.store(wall_seconds());
}

static inline void hooks_add(HookChain* c, const GPT2Hooks* h) {
    if (c->n == HOOK_CHAIN_MAX) { die("more than %d placement hook tables", HOOK_CHAIN_MAX); }
    c->tables[c->n++] = *h;
}
// remove the table(s) installed with this ctx (ZeRO-3 while the full model is materialised)
static inline void hooks_remove(HookChain* c, void* ctx) {
    int k = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->tables[i].ctx != ctx) { c->tables[k++] = c->tables[i]; }
    }
    c->n = k;
}

// ---- the events: begin in installation order, end in reverse

static inline void hooks_micro_begin(HookChain* c, int i, int n) {
    for (int k = 0; k < c->n; k++) { if (c->tables[k].micro_begin) { c->tables[k].micro_begin(c->tables[k].ctx, i, n); } }
    c->micro = i;
    if (c->progress) { hooks_progress(c, HOOK_MICRO, 0); }
}
static inline void hooks_forward_begin(HookChain* c, ParameterTensors* root) {
    for (int k = 0; k < c->n; k++) { if (c->tables[k].forward_begin) { c->tables[k].forward_begin(c->tables[k].ctx, root); } }
    if (c->progress) { hooks_progress(c, HOOK_FORWARD, 0); }
}
static inline void hooks_block_forward_begin(HookChain* c, int l, BlockWeights* w) {
    for (int k = 0; k < c->n; k++) {
        if (c->tables[k].block_forward_begin) { c->tables[k].block_forward_begin(c->tables[k].ctx, l, w); }
    }
    if (c->progress) { hooks_progress(c, HOOK_BLOCK_FORWARD, l); }
}
static inline void hooks_block_forward_end(HookChain* c, int l) {
    for (int k = c->n - 1; k >= 0; k--) {
        if (c->tables[k].block_forward_end) { c->tables[k].block_forward_end(c->tables[k].ctx, l); }
    }
}
static inline void hooks_backward_begin(HookChain* c, ParameterTensors* root, ParameterTensors* root_grads) {
    for (int k = 0; k < c->n; k++) {
        if (c->tables[k].backward_begin) { c->tables[k].backward_begin(c->tables[k].ctx, root, root_grads); }
    }
    if (c->progress) { hooks_progress(c, HOOK_BACKWARD, 0); }
}
static inline void hooks_block_backward_begin(HookChain* c, int l, BlockWeights* w, BlockWeights* g) {
    for (int k = 0; k < c->n; k++) {
        if (c->tables[k].block_backward_begin) { c->tables[k].block_backward_begin(c->tables[k].ctx, l, w, g); }
    }
    if (c->progress) { hooks_progress(c, HOOK_BLOCK_BACKWARD, l); }
}
static inline void hooks_block_backward_end(HookChain* c, int l) {
    for (int k = c->n - 1; k >= 0; k--) {
        if (c->tables[k].block_backward_end) { c->tables[k].block_backward_end(c->tables[k].ctx, l); }
    }
}
static inline void hooks_backward_end(HookChain* c) {
    if (c->progress) { hooks_progress(c, HOOK_BACKWARD_END, 0); }   // an end event: before the tables
    for (int k = c->n - 1; k >= 0; k--) { if (c->tables[k].backward_end) { c->tables[k].backward_end(c->tables[k].ctx); } }
}
