// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; the lecture "LLM Pre-training and
// Beyond", "Tensor Parallel"): the tp ranks of a mesh row split every matrix of the block, so
// each holds 1/tp of the weights and does 1/tp of their FLOPs.
//
//   attention:  x ─f─> [qkv: my NH/tp heads] ─> attention on my heads ─> [attproj: my C/tp rows] ─g─> + x
//   MLP:        x ─f─> [fc: my 4C/tp columns] ─> GELU ─────────────────> [fcproj: my 4C/tp rows] ─g─> + x
//     f: identity forward, all-reduce backward        g: all-reduce forward, identity backward
//
// Column-parallel (qkv, fc, the LM head): Y = X A, A split by output columns, A = [A_1 .. A_tp];
//   rank t computes Y_t = X A_t, its slice of Y, with no communication; its bias splits with A.
//   Every rank needs the whole X: f is the identity forward; backward, dX = sum_t dY_t A_t^T is a
//   sum of the ranks' terms: f all-reduces it.
// Row-parallel (attproj, fcproj): Z = Y B, B split by input rows; rank t holds Y_t (the output
//   of its column-parallel layer, or its heads' attention) and computes the term Z_t = Y_t B_t;
//   Z = sum_t Z_t: g all-reduces. The bias must be added once: rank 0 adds it to its term.
//   Backward: dY_t = dZ B_t^T needs only the whole dZ, which every rank has (g: identity).
// Attention needs no communication: qkv is split by heads (llmc/model/params.h, SHARD_HEADS), and
// each head attends on its own. Between the two halves the residual stream is whole on every rank.
//
// Cost per block and micro-step: 2 all-reduces forward (g, g) and 2 backward (f, f) of the B T C
// activations, 2 (tp-1)/tp B T C a bytes each per rank with a ring (a bytes per element); the
// embedding adds one g, the LM head one f, the loss 3 B T floats (vocab.h). Sequence
// parallelism (sp.h) sends the same bytes as all-gather + reduce-scatter pairs, plus one
// all-gather per column-parallel layer in the backward. The exact figures and the memory per
// rank: tp_accounting.h.
#pragma once

#include "tp_core.h"
#include "sp.h"
#include "vocab.h"
#include "dp_core.h"   // ShardGroup: what the data-parallel update asks of the tp group

// ---------------------------------------------------------------------------------------
// Megatron's f and g. Sequence parallelism (sp.h) replaces each where the residual stream holds
// only 1/tp of the tokens: f by g (all-gather / reduce-scatter), g by g-bar (reduce-scatter /
// all-gather).

// f, forward: the identity, every rank already holds the whole x
static inline const floatX* tp_f_forward(TensorParallel* tp, const OpAt* at, const floatX* x, int C) {
    if (sp_splits_stream(at)) { return sp_g_forward(tp, at, x, C); }
    return x;
}
// f, backward: all-reduce, dX = sum_t dY_t A_t^T; each rank's term is in dx_full, the sum lands in place
static inline void tp_f_backward(TensorParallel* tp, const OpAt* at, floatX* dx_full, floatX* dx, int C) {
    if (sp_splits_stream(at)) { sp_g_backward(tp, at, dx_full, dx, C); return; }
    tp_allreduce(tp, "TP f backward: all-reduce", dx_full, tp_full_count(at, C), COMM_FLOATX, COMM_SUM);
}
// g, forward: all-reduce, Z = sum_t Z_t; each rank's term is in z_full, the sum lands in place
static inline void tp_g_forward(TensorParallel* tp, const OpAt* at, floatX* z_full, floatX* z, int C) {
    if (sp_splits_stream(at)) { sp_gbar_forward(tp, at, z_full, z, C); return; }
    tp_allreduce(tp, "TP g: all-reduce", z_full, tp_full_count(at, C), COMM_FLOATX, COMM_SUM);
}
// g, backward: the identity, every rank has the whole dZ
static inline const floatX* tp_g_backward(TensorParallel* tp, const OpAt* at, const floatX* dz, int C) {
    if (sp_splits_stream(at)) { return sp_gbar_backward(tp, at, dz, C); }
    return dz;
}
// Where a layer writes the B x T terms that f's backward or g sums: the stream's own buffer,
// which holds all the tokens (SP: a scratch for all of them, the stream holding 1/tp)
static inline floatX* tp_partial_buffer(TensorParallel* tp, const OpAt* at, floatX* stream) {
    return sp_splits_stream(at) ? tp->full : stream;
}

// ---------------------------------------------------------------------------------------
// The linear entries (llmc/model/ops.h): column-parallel at qkv, fc and the LM head, row-parallel at
// attproj and fcproj. C and OC are this rank's local sizes (C/tp inputs for a row-parallel one).

static inline int tp_column_parallel(int site) { return site == LINEAR_QKV || site == LINEAR_FC || site == LINEAR_LM_HEAD; }

static inline void tp_linear_forward(void* ctx, const OpAt* at, int site, floatX* out, const floatX* inp, const floatX* w,
                                     const floatX* bias, int C, int OC) {
    TensorParallel* tp = (TensorParallel*)ctx;
    if (tp_column_parallel(site)) {
        const floatX* x = tp_f_forward(tp, at, inp, C);        // f: the whole input
        matmul_forward(out, x, w, bias, at->B, at->T, C, OC);  // my output columns, my bias slice
    } else {
        floatX* partial = tp_partial_buffer(tp, at, out);
        matmul_forward(partial, inp, w, tp->rank == 0 ? bias : NULL, at->B, at->T, C, OC);   // my term of the sum
        tp_g_forward(tp, at, partial, out, OC);                 // g: the sum over tp
    }
}

static inline void tp_linear_backward(void* ctx, const OpAt* at, int site, floatX* dinp, floatX* dw, floatX* dbias,
                                      const floatX* dout, const floatX* inp, const floatX* w, int C, int OC) {
    TensorParallel* tp = (TensorParallel*)ctx;
    if (tp_column_parallel(site)) {
        const floatX* x = tp_f_forward(tp, at, inp, C);        // SP: gather the input again (not kept)
        floatX* dx = tp_partial_buffer(tp, at, dinp);
        matmul_backward(dx, dw, dbias, dout, x, w, at->B, at->T, C, OC);   // dx: my term of dX
        tp_f_backward(tp, at, dx, dinp, C);                     // f backward: the sum over tp
    } else {
        const floatX* dz = tp_g_backward(tp, at, dout, OC);    // g backward: the whole dZ
        matmul_backward(dinp, dw, dbias, dz, inp, w, at->B, at->T, C, OC);
    }
}

// ---------------------------------------------------------------------------------------
// Setting up: the model was built as this rank's shard (plan_place: tp, tp_rank, sp), with its
// activations allocated; tp_init allocates the scratch and replaces the ops entries.

static inline void tp_init(TensorParallel* tp, GPT2* model, Comm* comm, int use_ring) {
    memset(tp, 0, sizeof(*tp));
    if (comm->size != model->place.tp || comm->rank != model->place.tp_rank) {
        die("tensor parallelism: the tp group (rank %d of %d) does not match the model's place (%d of %d)", comm->rank,
            comm->size, model->place.tp_rank, model->place.tp);
    }
    tp->comm = comm;
    tp->tp = comm->size;
    tp->rank = comm->rank;
    tp->sp = model->place.sp;
    tp->use_ring = use_ring;
    tp->model = model;
    size_t BT = (size_t)model->max_B * model->max_T, C = model->config.channels;
    tp->stats = (float*)device_malloc(3 * BT * sizeof(float));
    tp->row = (floatX*)device_malloc((size_t)gpt2_run_vocab(model) * sizeof(floatX));
    tp->scratch_bytes = 3 * BT * sizeof(float) + (size_t)gpt2_run_vocab(model) * sizeof(floatX);
    if (tp->sp) {
        tp->gathered = (floatX*)device_malloc(BT * C * sizeof(floatX));
        tp->full = (floatX*)device_malloc(BT * C * sizeof(floatX));
        tp->scratch_bytes += 2 * BT * C * sizeof(floatX);
    }
    GPT2Ops* o = &model->ops;
    o->linear.ctx = tp;
    o->linear.forward = tp_linear_forward;
    o->linear.backward = tp_linear_backward;
    o->embedding.ctx = tp;
    o->embedding.forward = vocab_embedding_forward;
    o->embedding.backward = vocab_embedding_backward;
    o->classifier.ctx = tp;
    o->classifier.loss = vocab_classifier;
    o->classifier.row_to_host = vocab_logits_row_to_host;
}

// What the data-parallel update asks of the tp group (dp_core.h's ShardGroup): SP's partial
// layernorm gradients made whole, and the squared gradient norm summed over the shards
static inline void tp_complete_grads(void* ctx, int tensor, floatX* grad, size_t n) {
    sp_sum_norm_grads((TensorParallel*)ctx, tensor, grad, n);
}
static inline double tp_sum_norm(void* ctx, double sq) {
    MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, ((TensorParallel*)ctx)->comm->mpi);   // 8 bytes, not counted
    return sq;
}
static inline ShardGroup tp_shard_group(TensorParallel* tp) { return ShardGroup{tp, tp_complete_grads, tp_sum_norm}; }

static inline void tp_free(TensorParallel* tp) {
    device_free(tp->stats);
    device_free(tp->row);
    if (tp->gathered) { device_free(tp->gathered); device_free(tp->full); }
    memset(tp, 0, sizeof(*tp));
}
