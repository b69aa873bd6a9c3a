// GPT-2: the activations its forward saves, its forward and backward passes in pieces, and the
// update. Backend-agnostic: tensors live in "device" memory (host memory on the CPU, GPU memory
// on CUDA); this file only calls kernels, ops and copies on them.
//
//   tokens (B, T)
//     |  embedding     x = wte[tokens] + wpe[positions]                              (B, T, C)
//   +-v- block l = 0 .. L-1, pre-LayerNorm ------------------------------------------------+
//   |  attention half  x = x + attproj( attention( qkv( ln1(x) ) ) )    qkv (B, T, 3C)      |
//   |  MLP half        x = x + fcproj( gelu( fc( ln2(x) ) ) )           fc  (B, T, 4C)      |
//   +-v------------------------------------------------------------------------------------+
//     |  head          logits = lnf(x) wte^T   (the LM head is the embedding, tied) (B, T, Vp)
//     v  loss          -log softmax(logits)[target], per token
//
// A micro-batch: the forward top to bottom, saving what the backward needs; the loss, leaving
// its gradient dlogits in place of the logits; the backward bottom to top, each piece the mirror
// of its forward, ADDING into the parameter gradients. After the step's micro-batches
// (llmc/model/step.h), gpt2_update clips by the global norm and runs AdamW. Read gpt2_forward
// and gpt2_backward first (near the end): the pieces in order, on slot 0 (a pipeline schedule
// runs the same pieces on several micro-batch SLOTs in flight). Cost per token: 6 FLOPs a
// parameter (2 forward, 4 backward) + 12 L C T for attention; memory: the parameters, their
// gradients, AdamW's m and v, the activations (gpt2_accounting.h counts them).
// The sublayers run through model->ops (ops.h); weights and gradients live where the placement
// hooks say (hooks.h); params.h lists the parameters. Beside this file: gpt2_build.h (building,
// memory), recompute.h (--recompute), zero_bubble_backward.h (the backward in two halves).
#pragma once

#include "gpt2_core.h"   // the types (GPT2, its activations), the shard sizes, the pieces declared

#include "moe_block.h"   // the MoE block's MLP (needs GPT2)

// the i-th of the step's n micro-batches starts (llmc/model/step.h)
static inline void gpt2_micro_begin(GPT2* model, int i, int n) {
    if (model->moe) { model->moe->micro_n = n; }   // the aux loss's gradient is a mean over the step
    hooks_micro_begin(&model->hooks, i, n);
}

// ---------------------------------------------------------------------------------------
// The MLP's default entries (model->ops.mlp): fc -> GELU -> fcproj through the linear entries.
// An MoE block's MLP is the experts instead (llmc/model/moe_block.h), all on this rank.
static const MoEExchange MOE_ONE_RANK = {NULL, 1, 0, NULL, NULL};

static inline void op_mlp_forward(void* ctx, const OpAt* at, MLPActs* a, const floatX* inp, const BlockWeights* w,
                                  int C, int H) {
    (void)ctx;
    if (gpt2_layer_is_moe(&at->model->config, at->layer)) { moe_forward(at->model, at, a->out, inp, w, C, H, &MOE_ONE_RANK); return; }
    const GPT2Ops* ops = &at->model->ops;
    ops->linear.forward(ops->linear.ctx, at, LINEAR_FC, a->fch, inp, w->fcw, w->fcb, C, H);
    gelu_forward(a->fch_gelu, a->fch, (size_t)at->B * at->T * H);
    ops->linear.forward(ops->linear.ctx, at, LINEAR_FCPROJ, a->out, a->fch_gelu, w->fcprojw, w->fcprojb, H, C);
}
static inline void op_mlp_backward(void* ctx, const OpAt* at, floatX* dinp, const floatX* dout, const MLPActs* a,
                                   const floatX* inp, const BlockWeights* w, BlockWeights* g, floatX* dh, int C, int H) {
    (void)ctx;
    if (gpt2_layer_is_moe(&at->model->config, at->layer)) { moe_backward(at->model, at, dinp, dout, inp, w, g, C, H, &MOE_ONE_RANK); return; }
    const GPT2Ops* ops = &at->model->ops;
    ops->linear.backward(ops->linear.ctx, at, LINEAR_FCPROJ, dh, g->fcprojw, g->fcprojb, dout, a->fch_gelu, w->fcprojw, H, C);
    gelu_backward(dh, a->fch, dh, (size_t)at->B * at->T * H);
    ops->linear.backward(ops->linear.ctx, at, LINEAR_FC, dinp, g->fcw, g->fcb, dh, inp, w->fcw, C, H);
}


// ---------------------------------------------------------------------------------------
// Forward pieces

// A micro-batch's tokens (host array, B x T) into a slot.
static inline void gpt2_set_batch(GPT2* model, int slot, const int* inputs, int B, int T) {
    if (slot < 0 || slot >= model->num_slots) { die("activation slot %d of %d", slot, model->num_slots); }
    if (B > model->max_B || T > model->max_T) {
        die("batch %dx%d is larger than the %dx%d the activations were allocated for", B, T, model->max_B, model->max_T);
    }
    if (model->place.sp && T % model->place.tp != 0) {
        die("sequence parallelism: a batch of sequence length %d does not split over tp %d", T, model->place.tp);
    }
    ActivationTensors* a = &model->acts[slot];
    a->B = B;
    a->T = T;
    a->chunk = 0;
    a->Ts = gpt2_place_stream_tokens(&model->place, T);
    if (inputs) { copy_host_to_device(a->inputs, inputs, (size_t)B * T * sizeof(int)); }
}

// The root tensors (embedding, head) for this micro-batch's forward: the hooks may move them.
static inline void gpt2_forward_begin(GPT2* model) {
    model->root = model->params;
    hooks_forward_begin(&model->hooks, &model->root);
}

static inline void gpt2_embed_forward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    OpAt at = gpt2_at(model, slot, -1);
    model->ops.embedding.forward(model->ops.embedding.ctx, &at, a->encoded, a->inputs, model->positions, model->root.wte,
                                 model->root.wpe, model->config.channels);
}

// The block's computation on given weights and activation buffers: the one copy of the block
// that training (gpt2_block_forward), generation (llmc/model/generate.h) and full recomputation
// (gpt2_block_recompute) share. In two pieces: up to ln2 (the attention half), then the MLP.
static inline void gpt2_block_compute_attention(GPT2* model, const GPT2Ops* ops, const OpAt* at, const BlockWeights* w,
                                                BlockActs* b) {
    int B = at->B, Ts = at->Ts, C = model->config.channels;   // the residual stream: B x Ts tokens
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), NH = gpt2_local_heads(model);
    layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, b->residual, w->ln1w, w->ln1b, B, Ts, C);
    ops->linear.forward(ops->linear.ctx, at, LINEAR_QKV, b->qkv, b->ln1, w->qkvw, w->qkvb, C, Cq);
    ops->attention.forward(ops->attention.ctx, at, b->atty, b->att, b->qkv, Ca, NH);
    ops->linear.forward(ops->linear.ctx, at, LINEAR_ATTPROJ, b->attproj, b->atty, w->attprojw, w->attprojb, Ca, C);
    residual_forward(b->residual2, b->residual, b->attproj, (size_t)B * Ts * C);
    layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->residual2, w->ln2w, w->ln2b, B, Ts, C);
}
static inline void gpt2_block_compute(GPT2* model, const GPT2Ops* ops, const OpAt* at, const BlockWeights* w,
                                      BlockActs* b) {
    int C = model->config.channels, H = gpt2_local_hidden(model);
    gpt2_block_compute_attention(model, ops, at, w, b);
    MLPActs mlp = {b->fch, b->fch_gelu, b->fcproj};
    ops->mlp.forward(ops->mlp.ctx, at, &mlp, b->ln2, w, C, H);
    residual_forward(b->residual3, b->residual2, b->fcproj, (size_t)at->B * at->Ts * C);
}

static inline void gpt2_block_forward(GPT2* model, int slot, int l) {
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    hooks_block_forward_begin(&model->hooks, l, &w);
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    gpt2_block_compute(model, &model->ops, &at, &w, &b);
    hooks_block_forward_end(&model->hooks, l);
}

// final layernorm and the tied LM head: logits (B, T, Vp) of the slot
static inline void gpt2_head_forward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    OpAt at = gpt2_at(model, slot, -1);
    int C = model->config.channels;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, gpt2_stage_output(model, slot), model->root.lnfw,
                      model->root.lnfb, a->B, a->Ts, C);
    model->ops.linear.forward(model->ops.linear.ctx, &at, LINEAR_LM_HEAD, a->logits, a->lnf, model->root.wte, NULL, C,
                              gpt2_local_vocab(model));
}

// Cross-entropy on the slot's logits. targets (and optional per-token weights) are host arrays
// of B x T. Returns the sum over tokens of w_i * CE_i; the caller divides by the number of
// tokens it averages over. With write_dlogits the logits are overwritten by the logit
// gradients (scaled by dloss) for the backward.
static inline float gpt2_head_loss(GPT2* model, int slot, const int* targets, const float* weights, float dloss,
                                   int write_dlogits) {
    ActivationTensors* a = &model->acts[slot];
    int BT = a->B * a->T;
    OpAt at = gpt2_at(model, slot, -1);
    copy_host_to_device(a->targets, targets, (size_t)BT * sizeof(int));
    if (weights) { copy_host_to_device(a->loss_weights, weights, (size_t)BT * sizeof(float)); }
    model->ops.classifier.loss(model->ops.classifier.ctx, &at, a->logits, a->losses, weights ? a->loss_weights : NULL, a->targets,
                          dloss, model->config.vocab_size, gpt2_run_vocab(model), write_dlogits);
    copy_device_to_host(model->losses_host, a->losses, (size_t)BT * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += model->losses_host[i]; }
    return (float)sum;
}

// ---------------------------------------------------------------------------------------
// Backward pieces: from the dlogits left by gpt2_head_loss to parameter gradients, which are
// ACCUMULATED (+=) so that several micro-steps add up before one update.
// The residual add's gradient is the identity into both of its inputs, so one buffer,
// dresidual, carries the residual stream's gradient down through all the layers; each
// branch reads it and each layernorm backward adds its input gradient into it.

static inline void gpt2_backward_begin(GPT2* model) {
    model->root_in_pass = 0;
    model->root = model->params;
    model->root_grads = model->grads;
    hooks_backward_begin(&model->hooks, &model->root, &model->root_grads);
}

// LM head and final layernorm: dresidual = d(stage output)
static inline void gpt2_head_backward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    GradientBuffers d = model->bufs;
    OpAt at = gpt2_at(model, slot, -1);
    int B = a->B, Ts = a->Ts, C = model->config.channels;
    model->root_in_pass = 1;
    model->ops.linear.backward(model->ops.linear.ctx, &at, LINEAR_LM_HEAD, d.dln, model->root_grads.wte, NULL, a->logits,
                               a->lnf, model->root.wte, C, gpt2_local_vocab(model));
    device_memset_zero(d.dresidual, (size_t)B * Ts * C * sizeof(floatX));
    layernorm_backward(d.dresidual, model->root_grads.lnfw, model->root_grads.lnfb, d.dln, gpt2_stage_output(model, slot),
                       model->root.lnfw, a->lnf_mean, a->lnf_rstd, B, Ts, C);
}

// dresidual holds d(block l's output) on entry, d(block l's input) on exit
static inline void gpt2_block_backward(GPT2* model, int slot, int l) {
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    BlockWeights gw = block_weights_in(model->grads_memory, model->param_info, &model->place, l);
    hooks_block_backward_begin(&model->hooks, l, &w, &gw);
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    if (model->recompute) { gpt2_block_recompute(model, &at, &w, &b); }   // --recompute: what the forward did not keep
    const GPT2Ops* ops = &model->ops;
    GradientBuffers d = model->bufs;
    int B = at.B, Ts = at.Ts, C = model->config.channels;   // layernorms: the residual stream's B x Ts tokens
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model), NH = gpt2_local_heads(model);
    // MLP half: dresidual holds d(residual3) = d(fcproj) = d(residual2) so far
    MLPActs mlp = {b.fch, b.fch_gelu, b.fcproj};
    ops->mlp.backward(ops->mlp.ctx, &at, d.dln, d.dresidual, &mlp, b.ln2, &w, &gw, d.dfch, C, H);
    layernorm_backward(d.dresidual, gw.ln2w, gw.ln2b, d.dln, b.residual2, w.ln2w, b.ln2_mean, b.ln2_rstd, B, Ts, C);
    // attention half: dresidual now holds d(residual2) = d(attproj) = d(residual)
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_ATTPROJ, d.datty, gw.attprojw, gw.attprojb, d.dresidual, b.atty,
                         w.attprojw, Ca, C);
    ops->attention.backward(ops->attention.ctx, &at, d.dqkv, d.datty, b.qkv, b.att, Ca, NH);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_QKV, d.dln, gw.qkvw, gw.qkvb, d.dqkv, b.ln1, w.qkvw, C, Cq);
    layernorm_backward(d.dresidual, gw.ln1w, gw.ln1b, d.dln, b.residual, w.ln1w, b.ln1_mean, b.ln1_rstd, B, Ts, C);
    hooks_block_backward_end(&model->hooks, l);
}

static inline void gpt2_embed_backward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    OpAt at = gpt2_at(model, slot, -1);
    model->root_in_pass = 1;
    model->ops.embedding.backward(model->ops.embedding.ctx, &at, model->root_grads.wte, model->root_grads.wpe, model->bufs.dresidual,
                                  a->inputs, model->positions, model->config.channels);
}

static inline void gpt2_backward_end(GPT2* model) { hooks_backward_end(&model->hooks); }

// ---------------------------------------------------------------------------------------
// The whole model on one micro-batch (slot 0), the pieces in order: what a rank that holds every
// layer runs, and what the tests call.

static inline void gpt2_forward(GPT2* model, const int* inputs, int B, int T) {
    gpt2_set_batch(model, 0, inputs, B, T);
    model->B = B;
    model->T = T;
    gpt2_forward_begin(model);
    if (model->place.has_embedding) { gpt2_embed_forward(model, 0); }
    for (int l = model->place.layer_begin; l < model->place.layer_end; l++) { gpt2_block_forward(model, 0, l); }
    if (model->place.has_head) { gpt2_head_forward(model, 0); }
}

static inline float gpt2_classifier(GPT2* model, const int* targets, const float* weights, float dloss, int write_dlogits) {
    return gpt2_head_loss(model, 0, targets, weights, dloss, write_dlogits);
}

static inline void gpt2_backward(GPT2* model) {
    gpt2_backward_begin(model);
    if (model->place.has_head) { gpt2_head_backward(model, 0); }
    for (int l = model->place.layer_end - 1; l >= model->place.layer_begin; l--) { gpt2_block_backward(model, 0, l); }
    if (model->place.has_embedding) { gpt2_embed_backward(model, 0); }
    gpt2_backward_end(model);
}

static inline void gpt2_zero_grad(GPT2* model) {
    PROFILE_OP("zero grad", OP_UPD, cost_zero_grad((double)model->num_parameters));
    device_memset_zero(model->grads_memory, model->num_parameters * sizeof(floatX));
}

// ---------------------------------------------------------------------------------------
// Update: global gradient norm, clipping (if grad_clip > 0), AdamW on every tensor.
// Returns the norm before clipping.

static inline float gpt2_grad_norm(GPT2* model) {
    float norm_sq;
    global_norm_squared(model->norm_squared, model->grads_memory, model->num_parameters);
    copy_device_to_host(&norm_sq, model->norm_squared, sizeof(float));
    return sqrtf(norm_sq);
}

static inline float gpt2_update(GPT2* model, float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_clip) {
    if (model->m_memory == NULL) { gpt2_allocate_optimizer(model); }
    float norm = gpt2_grad_norm(model) / model->loss_scale;   // the norm of the loss's gradient (unscaled)
    if (!isfinite(norm) && model->skip_nonfinite) { return norm; }   // the step is skipped: no AdamW, t unchanged
    // clipping, and 1/S: AdamW reads S x gradient and scales it in fp32
    float grad_scale = ((grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f) / model->loss_scale;
    model->step += 1;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
        if (p->numel == 0) { continue; }
        adamw_update(model->params_memory + p->offset, model->master_memory ? model->master_memory + p->offset : NULL,
                     model->grads_memory + p->offset, model->m_memory + p->offset, model->v_memory + p->offset, p->numel,
                     lr, beta1, beta2, eps, p->decay ? weight_decay : 0.0f, model->step, grad_scale,
                     (unsigned int)(model->step * 1000003u + i));   // stochastic rounding's seed: step and tensor
    }
    return norm;
}

// ---- beside the passes: the optional pieces that plug into them, the formulas, the building
#include "recompute.h"              // --recompute: gpt2_block_recompute
#include "zero_bubble_backward.h"   // gpt2_block_backward in two halves, B and W (zero-bubble pipelines)
#include "gpt2_accounting.h"        // bytes and FLOPs in closed form (the planner's, the memory tables')
#include "gpt2_build.h"             // shapes checked, memory allocated, parameters initialised, freed
