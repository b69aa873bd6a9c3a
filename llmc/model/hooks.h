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

typedef struct {
    GPT2Hooks tables[HOOK_CHAIN_MAX];
    int n;
} HookChain;

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
}
static inline void hooks_forward_begin(HookChain* c, ParameterTensors* root) {
    for (int k = 0; k < c->n; k++) { if (c->tables[k].forward_begin) { c->tables[k].forward_begin(c->tables[k].ctx, root); } }
}
static inline void hooks_block_forward_begin(HookChain* c, int l, BlockWeights* w) {
    for (int k = 0; k < c->n; k++) {
        if (c->tables[k].block_forward_begin) { c->tables[k].block_forward_begin(c->tables[k].ctx, l, w); }
    }
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
}
static inline void hooks_block_backward_begin(HookChain* c, int l, BlockWeights* w, BlockWeights* g) {
    for (int k = 0; k < c->n; k++) {
        if (c->tables[k].block_backward_begin) { c->tables[k].block_backward_begin(c->tables[k].ctx, l, w, g); }
    }
}
static inline void hooks_block_backward_end(HookChain* c, int l) {
    for (int k = c->n - 1; k >= 0; k--) {
        if (c->tables[k].block_backward_end) { c->tables[k].block_backward_end(c->tables[k].ctx, l); }
    }
}
static inline void hooks_backward_end(HookChain* c) {
    for (int k = c->n - 1; k >= 0; k--) { if (c->tables[k].backward_end) { c->tables[k].backward_end(c->tables[k].ctx); } }
}
