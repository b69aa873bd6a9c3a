// Activation recomputation (--recompute none|selective|full; doc/memory.md; Korthikanti et al.
// 2022, "Reducing Activation Recomputation in Large Transformer Models"): memory traded for
// compute. The forward keeps fewer activations per layer; the backward of each block first
// rebuilds the rest from what was kept, into ONE block's scratch set (GPT2.scratch) that every
// layer and slot shares (the backward runs one layer at a time, so one is enough, however many
// micro-batches a pipeline has in flight):
//
//   mode       kept per layer                       rebuilt first by the backward   extra FLOPs
//   none       everything (ActivationTensors)       nothing                         0
//   selective  all but att (the attention's state:  the attention op on the kept    4 L C T per
//              on the CPU the T x T probabilities   qkv, the GELU on the kept fch   token (the
//              of every head) and fch_gelu          (its input)                     attention core)
//   full       only the block's input (encoded,     the block's forward (through    the forward
//              then each layer's residual3)         the same ops: tensor-parallel   again: +1/3
//                                                   linears communicate again, in   of a step
//                                                   lockstep, as in Megatron)
//
// The recomputed tensors come from the same kernels on the same inputs, so the gradients, and
// the losses, are bit-identical to no recomputation. It plugs in at two points: the activation
// layout (gpt2_block_acts, llmc/model/gpt2_build.h) points what a mode does not keep at the
// scratch set, and gpt2_block_backward (llmc/model/gpt2.h), with --recompute, calls
// gpt2_block_recompute before it starts.
// The bytes of each mode: gpt2_activation_formula (llmc/model/gpt2_accounting.h). Included by
// llmc/model/gpt2.h (it needs GPT2).
#pragma once

#include <string.h>
#include "gpt2_core.h"   // GPT2

typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } Recompute;
static inline const char* gpt2_recompute_name(int r) {
    return r == RECOMPUTE_FULL ? "full" : r == RECOMPUTE_SELECTIVE ? "selective" : "none";
}
static inline int gpt2_recompute_parse(const char* s) {
    if (s == NULL || strcmp(s, "none") == 0) { return RECOMPUTE_NONE; }
    if (strcmp(s, "selective") == 0) { return RECOMPUTE_SELECTIVE; }
    if (strcmp(s, "full") == 0) { return RECOMPUTE_FULL; }
    die("--recompute must be none, selective or full, got '%s'", s);
    return RECOMPUTE_NONE;
}

// Recomputation (--recompute), at the start of block l's backward: rebuild in the scratch block
// what the forward did not keep, from what it kept, with the same kernels and ops on the same
// inputs (so the same bits), and the weights the backward's hooks provide (ZeRO-3 gathers them).
//   selective  the attention op again on the kept qkv: its state into the scratch, its output
//              (= the kept atty) into datty, free until the attention projection's backward
//              writes it; the GELU again on the kept fch
//   full       the block's forward from its kept input, without the last residual add (residual3
//              is kept: the next layer's input). An MoE block's MLP is not rerun: its routing
//              and expert activations live in the MoE's own per-slot buffers (llmc/model/moe_block.h), and
//              a second routing would count the step's statistics (and the all-to-alls) twice;
//              its backward needs only ln2, which the attention half rebuilds.
static inline void gpt2_block_rebuild(GPT2* model, const OpAt* at, const BlockWeights* w, BlockActs* b) {
    const GPT2Ops* ops = &model->ops;
    int C = model->config.channels, H = gpt2_local_hidden(model);
    int dense = !gpt2_layer_is_moe(&model->config, at->layer);
    if (model->recompute == RECOMPUTE_FULL) {
        gpt2_block_compute_attention(model, ops, at, w, b);
        if (dense) {
            MLPActs mlp = {b->fch, b->fch_gelu, b->fcproj};
            ops->mlp.forward(ops->mlp.ctx, at, &mlp, b->ln2, w, C, H);
        }
        return;
    }
    ops->attention.forward(ops->attention.ctx, at, model->bufs.datty, b->att, b->qkv, gpt2_local_attn(model),
                           gpt2_local_heads(model));
    if (dense) { gelu_forward(b->fch_gelu, b->fch, (size_t)at->B * at->T * H); }
}
// While it runs, model->recomputing tells ops that keep state across calls to replay what the
// forward did rather than record again (llmc/model/fp8_linear.h: the forward's scales, no second amax), and
// --precision's counters pause (each stored value counted once).
static inline void gpt2_block_recompute(GPT2* model, const OpAt* at, const BlockWeights* w, BlockActs* b) {
    model->recomputing = 1;
    backend_precision_counting(0);
    gpt2_block_rebuild(model, at, w, b);
    backend_precision_counting(1);
    model->recomputing = 0;
}

