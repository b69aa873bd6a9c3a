// FP8 linear layers, simulated (--fp8 current|delayed): the recipe of DeepSeek-V3's mixed-
// precision framework (its Figure 6, in the lecture), on any CPU or GPU. For each linear layer
// of a block (QKV, attention projection, FC, FC projection), with Q4 = E4M3 and Q5 = E5M2
// quantisation, each with its own per-tensor scale:
//
//   Fprop   Y  = Q4(X) Q4(W)^T        X: the layer's input,  W: its weight
//   Dgrad   dX = Q5(dY) Q4(W)         dY: the gradient of Y
//   Wgrad   dW = Q5(dY)^T Q4(X)
//
// Products accumulate in fp32 and land in floatX (bf16 on the GPU, the --precision format on
// the CPU); the master weights, the optimizer, the embedding, the LM head, attention's softmax
// and the layernorms keep their precision (as DeepSeek-V3 keeps them out of FP8). E4M3 (3
// mantissa bits, up to 448) for the forward's values, E5M2 (2 bits, up to 57344: range over
// precision) for the gradients, the hybrid format of NVIDIA's Transformer Engine.
//
// Quantising a tensor x: scale = 2^floor(log2(FP8_MAX / amax)), q = round_fp8(x * scale)
// (saturating), and the value the GEMM reads is q / scale (llmc/cpu/fp8.h, llmc/cuda/fp8.cuh:
// "fake quantisation", exact because the scale is a power of two). amax:
//   current   max |x| of this tensor now: no overflow, one more pass over x
//   delayed   the max of the amaxes of the last --fp8-history uses of this tensor (this layer,
//             site and kind): known before x is produced, so a fused kernel could quantise as
//             it writes x; values above it saturate at FP8_MAX. This use's amax is recorded.
// The forward's scales of X and W are kept per micro-batch slot, so the backward quantises
// exactly the values the forward used (a pipeline runs other micro-batches in between).
//
// Cost of the simulation: per linear, two amax passes and two quantise passes in the forward,
// three of each in the backward, and buffers for one quantised X, W and dY. A real FP8 GEMM
// reads half the bytes of bf16 and runs at twice the tensor-core rate (H100: 1979 vs 989
// dense TFLOP/s); this simulation shows what FP8 does to the loss, not to the time.
#pragma once

#include <vector>
#include "../common.h"
#include "../backend.h"
#include "gpt2.h"

typedef decltype(((GPT2Ops*)0)->linear) LinearEntry;

enum { FP8_X, FP8_W, FP8_DY, FP8_KINDS };

typedef struct {
    int on, delayed, history;
    LinearEntry inner;             // the entry this one wraps (the default, or tensor parallelism's)
    int keys;                      // (layer, site) pairs
    std::vector<float> amax;       // [key][kind][history]: recorded amaxes (delayed scaling)
    std::vector<int> uses;         // [key][kind]: how many were recorded
    std::vector<float> fwd_scale;  // [slot][key][X, W]: the scales the forward used
    floatX* buf[FP8_KINDS];
    size_t cap[FP8_KINDS];
    double quantised[FP8_KINDS];   // values quantised, for the summary
} Fp8;

static inline int fp8_key(const OpAt* at, int site) { return at->layer * NUM_LINEAR_SITES + site; }   // (layer, site)

static inline floatX* fp8_buffer(Fp8* f, int kind, size_t n) {
    if (n > f->cap[kind]) {
        if (f->buf[kind]) { device_free(f->buf[kind]); }
        f->buf[kind] = (floatX*)device_malloc(n * sizeof(floatX));
        f->cap[kind] = n;
    }
    return f->buf[kind];
}

static inline float fp8_scale_for(float amax, int kind) {
    float fmax = kind == FP8_DY ? E5M2_MAX : E4M3_MAX;
    if (amax != amax || isinf(amax)) { return NAN; }   // a non-finite tensor: the step's gradients show it
    if (amax == 0.0f) { return 1.0f; }
    return ldexpf(1.0f, (int)floorf(log2f(fmax / amax)));
}

// The scale for this use of (key, kind), and the amax recorded for the next ones
static inline float fp8_scale(Fp8* f, int key, int kind, const floatX* x, size_t n) {
    float now = fp8_absmax(x, n);
    size_t at = (size_t)key * FP8_KINDS + kind;
    float* hist = &f->amax[at * f->history];
    int used = f->uses[at] < f->history ? f->uses[at] : f->history;
    float amax = now;
    if (f->delayed && used > 0) {   // the history's max, before this use joins it
        amax = 0.0f;
        for (int i = 0; i < used; i++) { amax = fmaxf(amax, hist[i]); }
    }
    hist[f->uses[at] % f->history] = now;
    f->uses[at]++;
    return fp8_scale_for(amax, kind);
}

static inline floatX* fp8_quantised(Fp8* f, int kind, const floatX* x, size_t n, float scale) {
    floatX* q = fp8_buffer(f, kind, n);
    fp8_quantize(q, x, n, scale, kind == FP8_DY);
    f->quantised[kind] += (double)n;
    return q;
}

static inline int fp8_site_on(const OpAt* at, int site) { return site != LINEAR_LM_HEAD && at->layer >= 0; }
// the input's tokens per sequence: QKV and FC read the residual stream (Ts), the projections T
static inline size_t fp8_input_count(const OpAt* at, int site, int C) {
    int tokens = (site == LINEAR_QKV || site == LINEAR_FC) ? at->Ts : at->T;
    return (size_t)at->B * tokens * C;
}

static inline void fp8_linear_forward(void* ctx, const OpAt* at, int site, floatX* out, const floatX* inp, const floatX* w,
                                      const floatX* bias, int C, int OC) {
    Fp8* f = (Fp8*)ctx;
    if (!fp8_site_on(at, site)) { f->inner.forward(f->inner.ctx, at, site, out, inp, w, bias, C, OC); return; }
    int key = fp8_key(at, site);
    size_t nx = fp8_input_count(at, site, C), nw = (size_t)OC * C;
    float sx, sw;
    if (at->slot >= 0 && at->model->recomputing) {   // --recompute: the forward again, with its scales, recording nothing
        const float* s = &f->fwd_scale[((size_t)at->slot * f->keys + key) * 2];
        sx = s[0];
        sw = s[1];
    } else {
        sx = fp8_scale(f, key, FP8_X, inp, nx);
        sw = fp8_scale(f, key, FP8_W, w, nw);
    }
    if (at->slot >= 0) {   // training: the backward quantises with the same scales
        float* s = &f->fwd_scale[((size_t)at->slot * f->keys + key) * 2];
        s[0] = sx;
        s[1] = sw;
    }
    const floatX* qx = fp8_quantised(f, FP8_X, inp, nx, sx);
    const floatX* qw = fp8_quantised(f, FP8_W, w, nw, sw);
    f->inner.forward(f->inner.ctx, at, site, out, qx, qw, bias, C, OC);
}

static inline void fp8_linear_backward(void* ctx, const OpAt* at, int site, floatX* dinp, floatX* dw, floatX* dbias,
                                       const floatX* dout, const floatX* inp, const floatX* w, int C, int OC) {
    Fp8* f = (Fp8*)ctx;
    if (!fp8_site_on(at, site)) { f->inner.backward(f->inner.ctx, at, site, dinp, dw, dbias, dout, inp, w, C, OC); return; }
    int key = fp8_key(at, site);
    const float* s = &f->fwd_scale[((size_t)at->slot * f->keys + key) * 2];
    size_t nx = fp8_input_count(at, site, C), nw = (size_t)OC * C;
    int out_tokens = (site == LINEAR_QKV || site == LINEAR_FC) ? at->T : at->Ts;   // Y: the other side
    size_t ny = (size_t)at->B * out_tokens * OC;
    float sy = fp8_scale(f, key, FP8_DY, dout, ny);
    const floatX* qy = fp8_quantised(f, FP8_DY, dout, ny, sy);
    const floatX* qx = fp8_quantised(f, FP8_X, inp, nx, s[0]);
    const floatX* qw = fp8_quantised(f, FP8_W, w, nw, s[1]);
    f->inner.backward(f->inner.ctx, at, site, dinp, dw, dbias, qy, qx, qw, C, OC);
}

// Wrap the model's linear entry (after every strategy installed its own)
static inline void fp8_attach(Fp8* f, GPT2* model, const char* mode, int history) {
    for (int k = 0; k < FP8_KINDS; k++) { f->buf[k] = NULL; f->cap[k] = 0; f->quantised[k] = 0; }
    f->on = strcmp(mode, "off") != 0;
    if (!f->on) { return; }
    f->delayed = strcmp(mode, "delayed") == 0;
    f->history = history;
    f->keys = model->config.num_layers * NUM_LINEAR_SITES;
    f->amax.assign((size_t)f->keys * FP8_KINDS * history, 0.0f);
    f->uses.assign((size_t)f->keys * FP8_KINDS, 0);
    f->fwd_scale.assign((size_t)GPT2_MAX_SLOTS * f->keys * 2, 1.0f);
    f->inner = model->ops.linear;
    model->ops.linear.ctx = f;
    model->ops.linear.forward = fp8_linear_forward;
    model->ops.linear.backward = fp8_linear_backward;
}

static inline void fp8_print(const Fp8* f) {
    if (!f->on) { return; }
    if (f->delayed) {
        printf("fp8          the blocks' linears: inputs and weights E4M3, output gradients E5M2, per-tensor power-of-two "
               "scales, delayed (amax history %d); fp32 accumulation; LM head, embedding, attention, layernorms unchanged\n",
               f->history);
    } else {
        printf("fp8          the blocks' linears: inputs and weights E4M3, output gradients E5M2, per-tensor power-of-two "
               "scales, current; fp32 accumulation; LM head, embedding, attention, layernorms unchanged\n");
    }
}

static inline void fp8_free(Fp8* f) {
    for (int k = 0; k < FP8_KINDS; k++) { if (f->buf[k]) { device_free(f->buf[k]); f->buf[k] = NULL; } }
}
