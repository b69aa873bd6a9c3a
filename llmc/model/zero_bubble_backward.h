// The zero-bubble split backward (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"; the ZB-H1
// schedule of llmc/parallel/pp.h): gpt2_block_backward (llmc/model/gpt2.h) cut in two. The
// backward of a linear y = x W^T has two products that do not depend on each other:
//
//   B  dx  = dy W       the input gradient: what the previous pipeline stage waits for
//   W  dW += dy^T x     the weight gradient: needed only by the update, so it can wait and
//                       fill what would be the pipeline's bubble
//
//   B (gpt2_block_backward_input)   the input gradients only. Every linear and layernorm runs
//                                    with its weight-gradient half switched off (NULL), and keeps
//                                    its output gradient dY in `keep`.
//   W (gpt2_block_backward_weight)  the weight gradients, later, from what B kept:
//                                    dW += dY^T X for each linear, the layernorms' dgamma, dbeta.
// B + W compute exactly what gpt2_block_backward computes (the same kernels, the same sums): no
// extra FLOPs. The cost is memory: `keep` holds per layer d(residual3) and d(residual2)
// (B x Ts x C), d(fch) (B x T x H), d(qkv) (B x T x Cq), d(ln2 out) and d(ln1 out) (B x Ts x C):
// gpt2_keep_floats says how many. Included by llmc/model/gpt2.h (it needs GPT2).
#pragma once

#include <string.h>
#include "gpt2_core.h"   // GPT2
#include "recompute.h"   // the --recompute modes

typedef struct { floatX *dres3, *dfch, *dln2, *dres2, *dqkv, *dln1; } BlockGradKeep;

static inline size_t gpt2_keep_floats(const GPT2* m, int B, int T) {
    size_t BT = (size_t)B * T, BTs = (size_t)B * gpt2_place_stream_tokens(&m->place, T), C = m->config.channels;
    return 4 * BTs * C + BT * gpt2_local_hidden(m) + BT * gpt2_local_qkv(m);
}
static inline BlockGradKeep gpt2_keep_at(const GPT2* m, floatX* base, int B, int T) {
    size_t BT = (size_t)B * T, BTs = (size_t)B * gpt2_place_stream_tokens(&m->place, T), C = m->config.channels;
    BlockGradKeep k;
    k.dres3 = base;
    k.dres2 = k.dres3 + BTs * C;
    k.dln2 = k.dres2 + BTs * C;
    k.dln1 = k.dln2 + BTs * C;
    k.dfch = k.dln1 + BTs * C;
    k.dqkv = k.dfch + BT * gpt2_local_hidden(m);
    return k;
}

// B needs the block's weights but no gradient buffer: it raises no placement hook (ZeRO-3, which
// gathers weights in them, does not combine with it). W raises the block's backward hooks, so
// data parallelism's buckets receive the weight gradients and see the block complete after W.
// Recomputation does not combine with it either: W reads the activations long after B, with other
// micro-batches' B passes in between, so one recomputed scratch block cannot serve both.
static inline void gpt2_block_backward_input(GPT2* model, int slot, int l, const BlockGradKeep* k) {
    if (model->params_memory == NULL) { die("the zero-bubble backward needs this rank's weights in place (not ZeRO-3)"); }
    if (model->recompute != RECOMPUTE_NONE) {
        die("--recompute %s does not combine with --pp-schedule zb-h1: its split backward reads the activations twice, "
            "apart", gpt2_recompute_name(model->recompute));
    }
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    BlockWeights gw;
    memset(&gw, 0, sizeof(gw));   // no weight gradients in this half
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    const GPT2Ops* ops = &model->ops;
    GradientBuffers d = model->bufs;
    int B = at.B, Ts = at.Ts, C = model->config.channels;
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model), NH = gpt2_local_heads(model);
    size_t BTsC = (size_t)B * Ts * C;
    copy_device_to_device(k->dres3, d.dresidual, BTsC * sizeof(floatX));   // fcproj's dY
    MLPActs mlp = {b.fch, b.fch_gelu, b.fcproj};
    ops->mlp.backward(ops->mlp.ctx, &at, k->dln2, d.dresidual, &mlp, b.ln2, &w, &gw, k->dfch, C, H);   // dfch: fc's dY
    layernorm_backward(d.dresidual, NULL, NULL, k->dln2, b.residual2, w.ln2w, b.ln2_mean, b.ln2_rstd, B, Ts, C);
    copy_device_to_device(k->dres2, d.dresidual, BTsC * sizeof(floatX));   // attproj's dY
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_ATTPROJ, d.datty, NULL, NULL, d.dresidual, b.atty, w.attprojw, Ca, C);
    ops->attention.backward(ops->attention.ctx, &at, k->dqkv, d.datty, b.qkv, b.att, Ca, NH);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_QKV, k->dln1, NULL, NULL, k->dqkv, b.ln1, w.qkvw, C, Cq);
    layernorm_backward(d.dresidual, NULL, NULL, k->dln1, b.residual, w.ln1w, b.ln1_mean, b.ln1_rstd, B, Ts, C);
}

static inline void gpt2_block_backward_weight(GPT2* model, int slot, int l, const BlockGradKeep* k) {
    if (model->recompute != RECOMPUTE_NONE) { die("--recompute %s does not combine with --pp-schedule zb-h1", gpt2_recompute_name(model->recompute)); }
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    BlockWeights gw = block_weights_in(model->grads_memory, model->param_info, &model->place, l);
    hooks_block_backward_begin(&model->hooks, l, &w, &gw);
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    const GPT2Ops* ops = &model->ops;
    int B = at.B, Ts = at.Ts, C = model->config.channels;
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_FCPROJ, NULL, gw.fcprojw, gw.fcprojb, k->dres3, b.fch_gelu, w.fcprojw, H, C);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_FC, NULL, gw.fcw, gw.fcb, k->dfch, b.ln2, w.fcw, C, H);
    layernorm_backward(NULL, gw.ln2w, gw.ln2b, k->dln2, b.residual2, w.ln2w, b.ln2_mean, b.ln2_rstd, B, Ts, C);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_ATTPROJ, NULL, gw.attprojw, gw.attprojb, k->dres2, b.atty, w.attprojw, Ca, C);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_QKV, NULL, gw.qkvw, gw.qkvb, k->dqkv, b.ln1, w.qkvw, C, Cq);
    layernorm_backward(NULL, gw.ln1w, gw.ln1b, k->dln1, b.residual, w.ln1w, b.ln1_mean, b.ln1_rstd, B, Ts, C);
    hooks_block_backward_end(&model->hooks, l);
}

