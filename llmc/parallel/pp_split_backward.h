// The backward cut in two for a zero-bubble schedule (ZB-H1, pp_zbh1.h; Qi et al., "Zero Bubble
// Pipeline Parallelism"): B computes only the gradient of the chunk's input, which the previous
// stage waits for (gpt2_block_backward_input), and W, later, the weight gradients
// (gpt2_block_backward_weight) from what B kept of each layer: its output gradients
// (BlockGradKeep; gpt2_keep_floats says how many). The slot's activations live until W.
//
//   whole backward (pp_backward)    B(i) = dx and dW of every layer; the slot is free
//   split (here)                    B(i) = dx of every layer, keeping dy;  W(i) = dW; the slot is free
//
// Memory: the kept output gradients, per slot and layer, on top of the activation slots.
// pp_split_backward_init plugs the two halves into the executor (pp.h) as its B and W.
#pragma once

#include "pp.h"

static inline BlockGradKeep pp_keep(PipelineParallel* pp, int slot, int li) {
    size_t per_slot = pp->keep_per_layer * (size_t)gpt2_slot_layers(pp->model);
    return gpt2_keep_at(pp->model, pp->keep + (size_t)slot * per_slot + (size_t)li * pp->keep_per_layer, pp->model->max_B, pp->model->max_T);
}

static inline void pp_block_backward_input(PipelineParallel* pp, int slot, int l, int i) {
    BlockGradKeep k = pp_keep(pp, slot, i);
    gpt2_block_backward_input(pp->model, slot, l, &k);
}

// B(i, c): the input half; the slot stays for W
static inline void pp_backward_input(PipelineParallel* pp, const PPAction* a, int n) {
    (void)n;
    int slot = pp->slot_of[pp_id(pp, a->micro, a->chunk)];
    if (slot < 0) { die("pipeline stage %d: backward of micro-batch %d before its forward", pp->stage, a->micro); }
    pp_backward_chunk(pp, a, slot, pp_block_backward_input);
}

// W(i, c): the weight half; then the slot is free. The W's count the chunk's backward passes
// (data parallelism communicates in the last: the weight gradients are whole only then).
static inline void pp_weight(PipelineParallel* pp, const PPAction* a, int n) {
    GPT2* model = pp->model;
    gpt2_micro_begin(model, pp->passes[a->chunk]++, n);
    int slot = pp->slot_of[pp_id(pp, a->micro, a->chunk)];
    int l0 = pp_layer0(pp, a->chunk), nl = gpt2_slot_layers(model);
    for (int l = l0 + nl - 1; l >= l0; l--) {
        BlockGradKeep k = pp_keep(pp, slot, l - l0);
        gpt2_block_backward_weight(model, slot, l, &k);
    }
    pp_free_slot(pp, a->micro, a->chunk);
}

// the kept output gradients for `slots` activation slots, and the two halves as the stage's B and W
static inline void pp_split_backward_init(PipelineParallel* pp, int slots) {
    pp->keep_per_layer = gpt2_keep_floats(pp->model, pp->model->max_B, pp->model->max_T);
    size_t bytes = pp->keep_per_layer * gpt2_slot_layers(pp->model) * (size_t)slots * sizeof(floatX);
    pp->keep = (floatX*)device_malloc(bytes);
    pp->buffer_bytes += bytes;
    pp->backward = pp_backward_input;
    pp->weight = pp_weight;
}
