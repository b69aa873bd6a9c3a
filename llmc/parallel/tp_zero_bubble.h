// The zero-bubble pipeline's weight pass on tensor-parallel linears (Zero Bubble Pipeline
// Parallelism, Qi et al. 2023, ZB-H1; llmc/parallel/pp.h). The pipeline cuts each block's backward
// in two: B, the input gradients (what the previous stage waits for), and W, the weight
// gradients, run later. W calls every linear's backward with no input gradient (dinp NULL).
//
// A column-parallel linear's W pass computes dW = dY^T X from its whole input X (f's forward, as
// in the backward) and nothing else: there is no dX, so f's backward (the all-reduce) does not
// run. A row-parallel one needs nothing special: dW needs the whole dZ (g's backward, the
// identity) and the kernel skips dX when dinp is NULL.
#pragma once

#include "tp.h"

static inline void tp_zero_bubble_linear_backward(void* ctx, const OpAt* at, int site, floatX* dinp, floatX* dw,
                                                  floatX* dbias, const floatX* dout, const floatX* inp, const floatX* w,
                                                  int C, int OC) {
    if (dinp != NULL || !tp_column_parallel(site)) {   // B, or any row-parallel pass: the plain backward
        tp_linear_backward(ctx, at, site, dinp, dw, dbias, dout, inp, w, C, OC);
        return;
    }
    TensorParallel* tp = (TensorParallel*)ctx;
    const floatX* x = tp_f_forward(tp, at, inp, C);
    matmul_backward(NULL, dw, dbias, dout, x, w, at->B, at->T, C, OC);   // the weight gradient only
}

// With a zero-bubble schedule: the linears' backward, after tp_init installed the plain one
static inline void tp_zero_bubble_attach(TensorParallel* tp) {
    tp->model->ops.linear.backward = tp_zero_bubble_linear_backward;
}
