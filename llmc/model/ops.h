// The ops: HOW each sublayer of GPT-2 is computed. One of the three extension points of
// doc/architecture.md (the others: the placement hooks of llmc/model/hooks.h, where weights and
// gradients live; the step of llmc/model/step.h, the order of the passes).
//
//   x ──ln1──> [linear QKV] ──> [attention] ──> [linear ATTPROJ] ──(+x)──ln2──> [mlp] ──(+)──>
//   tokens ──> [embedding] ──> blocks ──> lnf ──> [linear LM_HEAD] ──> [classifier] ──> loss
//
// The passes (llmc/model/gpt2.h) call every bracketed sublayer through model->ops; the default
// entries below are the backend's kernels on the whole layer (the mlp's are in gpt2.h: fc, GELU,
// fcproj through the linear entries, so a tensor-parallel linear parallelises the MLP too).
// A strategy replaces entries, never the passes:
//   tensor/sequence parallelism  linear (column-parallel QKV/FC with f, row-parallel ATTPROJ/
//                                FCPROJ with g), embedding + LM_HEAD + classifier (vocab-parallel)
//   context parallelism          attention (ring attention over the cp group)
//   expert parallelism           mlp (router, all-to-all dispatch, experts, combine)
//   generation (generate.h)      attention (over the KV cache)
// An op sees where it is called (OpAt) and this rank's LOCAL sizes (QKV's 3C/tp outputs, NH/tp
// heads, 4C/tp hidden units: llmc/model/params_shard.h). Its input and output on the residual
// stream (the embedding's output, a linear's input at QKV/FC/LM_HEAD and output at ATTPROJ/
// FCPROJ, the MLP's) have B x Ts tokens, everything inside B x T: the default entries need
// Ts = T, the sequence-parallel ones gather and scatter between the two. Each sublayer's entries
// carry their own `ctx` (the owner's state), so strategies that replace different ones do not collide.
#pragma once

#include "../common.h"
#include "../backend.h"
#include "params.h"

struct GPT2;
typedef struct {
    struct GPT2* model;
    int slot;        // micro-batch slot (llmc/model/gpt2.h): whose saved activations
    int layer;       // global layer index, -1 outside the blocks
    int B, T;        // micro-batch: B sequences of T tokens
    int Ts;          // tokens per sequence on this rank's residual stream (T, or T/tp with SP)
} OpAt;

typedef enum { LINEAR_QKV, LINEAR_ATTPROJ, LINEAR_FC, LINEAR_FCPROJ, LINEAR_LM_HEAD, NUM_LINEAR_SITES } LinearSite;

// the MLP's saved activations: fch = fc(x) before GELU, fch_gelu after, out = fcproj(...)
typedef struct { floatX *fch, *fch_gelu, *out; } MLPActs;

// Each sublayer: a forward, a backward, and the ctx its owner passes to both.
typedef struct {
    struct {   // out (B,T,C) = wte[tokens] + wpe[positions] (NULL: 0..T-1 in every sequence; generation
        void* ctx;   // gives each token's, context parallelism this rank's part of the sequence, the
                     // same in every sequence); backward: dwte, dwpe += the gradient of out
        void (*forward)(void* ctx, const OpAt* at, floatX* out, const int* tokens, const int* positions,
                        const floatX* wte, const floatX* wpe, int C);
        void (*backward)(void* ctx, const OpAt* at, floatX* dwte, floatX* dwpe, const floatX* dout, const int* tokens,
                         const int* positions, int C);
    } embedding;
    struct {   // out (B,T,OC) = inp (B,T,C) w^T + bias (bias may be NULL); backward: dinp = dout w
        void* ctx;   // (overwritten), dw and dbias += (accumulated)
        void (*forward)(void* ctx, const OpAt* at, int site, floatX* out, const floatX* inp, const floatX* w,
                        const floatX* bias, int C, int OC);
        void (*backward)(void* ctx, const OpAt* at, int site, floatX* dinp, floatX* dw, floatX* dbias,
                         const floatX* dout, const floatX* inp, const floatX* w, int C, int OC);
    } linear;
    struct {   // out (B,T,C) = causal attention of qkv (B,T,3C) with NH heads; `state` is saved for backward
        void* ctx;   // state_size: the floats of `state` per layer (NULL: the kernel's attention_state_size)
        size_t (*state_size)(void* ctx, int B, int T, int C, int NH);
        void (*forward)(void* ctx, const OpAt* at, floatX* out, float* state, const floatX* qkv, int C, int NH);
        void (*backward)(void* ctx, const OpAt* at, floatX* dqkv, const floatX* dout, const floatX* qkv,
                         const float* state, int C, int NH);
    } attention;
    struct {   // acts->out (B,T,C) = fcproj(gelu(fc(inp))), H hidden units; backward: dinp overwritten,
        void* ctx;   // the MLP's weight gradients in g accumulate, dh is (B,T,H) scratch
        void (*forward)(void* ctx, const OpAt* at, MLPActs* acts, const floatX* inp, const BlockWeights* w, int C, int H);
        void (*backward)(void* ctx, const OpAt* at, floatX* dinp, const floatX* dout, const MLPActs* acts,
                         const floatX* inp, const BlockWeights* w, BlockWeights* g, floatX* dh, int C, int H);
    } mlp;
    struct {   // per-token cross-entropy of logits (B,T,Vp) against targets, times the optional
        void* ctx;   // weights, into losses (B,T); write_dlogits: logits become dloss * dCE/dlogits
        void (*loss)(void* ctx, const OpAt* at, floatX* logits, float* losses, const float* weights, const int* targets,
                     float dloss, int V, int Vp, int write_dlogits);
        // row `row` of the logits (this rank's columns of it) as the whole row of Vp floats in host
        // memory, for sampling; scratch is device memory for Vp floats
        void (*row_to_host)(void* ctx, const OpAt* at, const floatX* logits, int row, int Vp, float* scratch, float* out);
    } classifier;
} GPT2Ops;

// ---------------------------------------------------------------------------------------
// The default entries: the backend's kernels (llmc/cpu/ or llmc/cuda/), one layer whole.

static inline void op_embedding_forward(void* ctx, const OpAt* at, floatX* out, const int* tokens, const int* positions,
                                        const floatX* wte, const floatX* wpe, int C) {
    (void)ctx;
    encoder_forward_vocab(out, tokens, positions, wte, wpe, 0, INT_MAX, at->B, at->T, C);
}
static inline void op_embedding_backward(void* ctx, const OpAt* at, floatX* dwte, floatX* dwpe, const floatX* dout,
                                         const int* tokens, const int* positions, int C) {
    (void)ctx;
    encoder_backward_vocab(dwte, dwpe, dout, tokens, positions, 0, INT_MAX, at->B, at->T, C);
}
static inline void op_linear_forward(void* ctx, const OpAt* at, int site, floatX* out, const floatX* inp,
                                     const floatX* w, const floatX* bias, int C, int OC) {
    (void)ctx; (void)site;
    matmul_forward(out, inp, w, bias, at->B, at->T, C, OC);
}
static inline void op_linear_backward(void* ctx, const OpAt* at, int site, floatX* dinp, floatX* dw, floatX* dbias,
                                      const floatX* dout, const floatX* inp, const floatX* w, int C, int OC) {
    (void)ctx; (void)site;
    matmul_backward(dinp, dw, dbias, dout, inp, w, at->B, at->T, C, OC);
}
static inline void op_attention_forward(void* ctx, const OpAt* at, floatX* out, float* state, const floatX* qkv, int C,
                                        int NH) {
    (void)ctx;
    attention_forward(out, state, qkv, at->B, at->T, C, NH);
}
static inline void op_attention_backward(void* ctx, const OpAt* at, floatX* dqkv, const floatX* dout,
                                         const floatX* qkv, const float* state, int C, int NH) {
    (void)ctx;
    attention_backward(dqkv, dout, qkv, state, at->B, at->T, C, NH);
}
static inline void op_classifier(void* ctx, const OpAt* at, floatX* logits, float* losses, const float* weights,
                                 const int* targets, float dloss, int V, int Vp, int write_dlogits) {
    (void)ctx;
    fused_classifier(logits, losses, weights, targets, dloss, at->B, at->T, V, Vp, write_dlogits);
}
static inline void op_logits_row_to_host(void* ctx, const OpAt* at, const floatX* logits, int row, int Vp, float* scratch,
                                         float* out) {
    (void)ctx; (void)at;
    convert_floatX_to_float(scratch, logits + (size_t)row * Vp, Vp);   // no allocation per call
    copy_device_to_host(out, scratch, (size_t)Vp * sizeof(float));
}
