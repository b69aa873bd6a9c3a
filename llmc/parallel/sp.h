// Sequence parallelism (Megatron, Korthikanti et al. 2022; the lecture "LLM Pre-training and
// Beyond", "TP + SP"): between the tensor-parallel layers, the layernorms, the residual adds and
// the embedding's output work token by token, so plain TP computes them redundantly on every
// rank on all B x T tokens.
// SP splits those tokens over the tp ranks instead: each rank's residual stream holds B x T/tp.
//
//   stream (B T/tp) ──g──> [column-parallel] ... [row-parallel] ──g-bar──> stream (B T/tp)
//     g:     all-gather forward (B T/tp -> B T),  reduce-scatter backward
//     g-bar: reduce-scatter forward (partial sums of B T -> this rank's B T/tp, summed), all-gather backward
//
// Ring all-reduce = reduce-scatter + all-gather, so SP's g and g-bar send exactly the bytes of
// TP's all-reduces; the activations of the stream are divided by tp. One addition: the
// column-parallel layer's weight gradient dW = dY^T X needs its whole input X again in the
// backward; keeping the gathered X would undo the memory saving, so (as Megatron does) the
// backward gathers it again: one all-gather of B T C per column-parallel layer more (tp.h).
//
// tp.h's f and g call these where the stream is split (sp_splits_stream); the B x T partial
// sums they reduce-scatter are written to the scratch tp->full (tp_partial_buffer).
//
// Which tokens: the micro-batch's B x T tokens, flattened in our (B, T, C) layout, in tp
// contiguous blocks (rank r: tokens [r BT/tp, (r+1) BT/tp)). Megatron's layout is (T, B, C), so
// its blocks are slices of the sequence; ours are slices of the batch-major token list. Every
// operation on the stream is token-wise, so which tokens a rank holds changes nothing but
// the layout of the collectives, and contiguous blocks need no copy. (--sp still asks T to be
// divisible by tp: T/tp tokens per sequence, the figure of the memory formula.)
//
// The layernorm weights see only this rank's tokens, so their gradients are partial sums over
// tp: sp_sum_norm_grads adds them up over the group before the update (the norm and AdamW
// need the whole gradient). The row-parallel biases and wpe get their gradients from the
// gathered (whole) output gradient, so theirs are complete on every rank.
#pragma once

#include "tp_core.h"

// SP runs where the residual stream holds 1/tp of the tokens (Ts < T). Where it holds all of
// them (generation, one token at a time) a sequence-parallel model runs plain TP's f and g.
static inline int sp_splits_stream(const OpAt* at) { return at->Ts < at->T; }

// g: the stream's blocks gathered into the whole input of a column-parallel layer; backward,
// the layer's input gradient (B x T, a term per rank) summed and scattered back into the blocks
static inline const floatX* sp_g_forward(TensorParallel* tp, const OpAt* at, const floatX* x, int C) {
    tp_allgather(tp, "SP g: all-gather", x, tp->gathered, tp_full_count(at, C));
    return tp->gathered;
}
static inline void sp_g_backward(TensorParallel* tp, const OpAt* at, floatX* dx_full, floatX* dx, int C) {
    tp_reduce_scatter(tp, "SP g backward: reduce-scatter", dx_full, dx, tp_full_count(at, C));
}
// g-bar: a row-parallel layer's partial sums (B x T) summed and scattered into the stream's
// blocks; backward, the stream's output gradient gathered whole
static inline void sp_gbar_forward(TensorParallel* tp, const OpAt* at, floatX* y_full, floatX* y, int C) {
    tp_reduce_scatter(tp, "SP g-bar: reduce-scatter", y_full, y, tp_full_count(at, C));
}
static inline const floatX* sp_gbar_backward(TensorParallel* tp, const OpAt* at, const floatX* dy, int C) {
    tp_allgather(tp, "SP g-bar backward: all-gather", dy, tp->gathered, tp_full_count(at, C));
    return tp->gathered;
}

// Before the update: the layernorm gradients in [grad, grad + n) of table entry `tensor`, a
// partial sum over the tp ranks, become the whole sum on every rank (an all-reduce on the tp
// group, counted with its other traffic). Other tensors are left alone.
static inline void sp_sum_norm_grads(TensorParallel* tp, int tensor, floatX* grad, size_t n) {
    if (!tp->sp || !tp->model->param_info[tensor].norm || n == 0) { return; }
    tp_allreduce(tp, "SP layernorm gradients: all-reduce", grad, n, COMM_FLOATX, COMM_SUM);
}
