// Vocabulary parallelism (Megatron's VocabParallelEmbedding and vocab-parallel cross-entropy):
// wte (Vp x C) is split by rows, rank t holding tokens [t Vs, (t+1) Vs) with Vs = Vp/tp (the
// padded vocabulary, so every rank gets an equal share; the padding rows are zero and never a
// target). Where tp does not divide Vp, Vs is larger (llmc/model/params_shard.h: tp_vocab_rows; 320 rows
// over tp 3: 3 x 128): the run computes with tp Vs rows, those past Vp zero like the rest of
// the padding, and checkpoints keep Vp. The same shard is the tied LM head.
//
// Embedding:  rank t looks up the tokens it holds and writes 0 for the others; rank 0 also adds
//   wpe. Summing over the ranks (g: all-reduce, or SP's reduce-scatter) gives
//   wte[token] + wpe[t] exactly: all but one of the terms are 0.
//     backward: the output gradient, whole again (g: identity, or SP's all-gather), scatters into
//     the rows this rank holds; every rank adds all of it into dwpe (so wpe's gradient is
//     complete everywhere, like the replicated tensor it is).
// LM head:  a column-parallel linear (tp.h) with Vs output columns: logits (B, T, Vs) per rank.
// Loss, without ever forming a row of Vp logits on one rank (Megatron-LM's vocab-parallel
// cross-entropy, Shoeybi et al. 2019; per token i, target y):
//     m_i = max_t (max over rank t's real columns)                 all-reduce MAX of B T floats
//     s_i = sum_t sum_v exp(x_v - m_i),  x_y = sum_t (x_y if t holds y, else 0)
//                                                                  all-reduce SUM of 2 B T floats
//     loss_i = m_i + log s_i - x_y;  dlogit_v = dloss w_i (exp(x_v - m_i)/s_i - [v = y])   local
// Every rank ends with every token's loss; the logit gradients stay split like the logits.
// Cost per micro-step: 3 B T floats all-reduced, against B T Vp / tp logits per rank that a
// gathered softmax would have to move.
#pragma once

#include "tp_core.h"

// tp.h: the embedding sums its terms with g, as a row-parallel linear does
static inline floatX* tp_partial_buffer(TensorParallel* tp, const OpAt* at, floatX* stream);
static inline void tp_g_forward(TensorParallel* tp, const OpAt* at, floatX* z_full, floatX* z, int C);
static inline const floatX* tp_g_backward(TensorParallel* tp, const OpAt* at, const floatX* dz, int C);

static inline int vocab_shard_rows(const TensorParallel* tp) { return gpt2_local_vocab(tp->model); }

static inline void vocab_embedding_forward(void* ctx, const OpAt* at, floatX* out, const int* tokens, const int* positions,
                                           const floatX* wte, const floatX* wpe, int C) {
    TensorParallel* tp = (TensorParallel*)ctx;
    int Vs = vocab_shard_rows(tp);
    floatX* partial = tp_partial_buffer(tp, at, out);   // B x T tokens
    encoder_forward_vocab(partial, tokens, positions, wte, tp->rank == 0 ? wpe : NULL, tp->rank * Vs, Vs, at->B, at->T, C);
    tp_g_forward(tp, at, partial, out, C);
}

static inline void vocab_embedding_backward(void* ctx, const OpAt* at, floatX* dwte, floatX* dwpe, const floatX* dout,
                                            const int* tokens, const int* positions, int C) {
    TensorParallel* tp = (TensorParallel*)ctx;
    int Vs = vocab_shard_rows(tp);
    const floatX* dy = tp_g_backward(tp, at, dout, C);   // B x T tokens
    encoder_backward_vocab(dwte, dwpe, dy, tokens, positions, tp->rank * Vs, Vs, at->B, at->T, C);
}

// Sampling (llmc/model/generate.h) needs a whole row of logits: rank t's Vs columns are the row's
// block t, so one all-gather in rank order puts the row together (Vp = tp Vs elements on every
// rank: the run's padded vocabulary, gpt2_run_vocab).
static inline void vocab_logits_row_to_host(void* ctx, const OpAt* at, const floatX* logits, int row, int Vp,
                                            float* scratch, float* out) {
    TensorParallel* tp = (TensorParallel*)ctx;
    int Vs = Vp / tp->tp;
    tp_allgather(tp, "vocab: all-gather a row of logits", logits + (size_t)row * Vs, tp->row, (size_t)Vp);
    op_logits_row_to_host(NULL, at, tp->row, 0, Vp, scratch, out);
}

static inline void vocab_classifier(void* ctx, const OpAt* at, floatX* logits, float* losses, const float* weights,
                                    const int* targets, float dloss, int V, int Vp, int write_dlogits) {
    TensorParallel* tp = (TensorParallel*)ctx;
    int N = at->B * at->T, Vs = Vp / tp->tp, v0 = tp->rank * Vs;
    float* maxes = tp->stats;
    float* sums = tp->stats + N;
    vocab_row_max(maxes, logits, N, Vs, v0, V);
    tp_allreduce(tp, "vocab loss: all-reduce max", maxes, (size_t)N, COMM_FP32, COMM_MAX);
    vocab_row_sum_target(sums, logits, maxes, targets, N, Vs, v0, V);
    tp_allreduce(tp, "vocab loss: all-reduce sums", sums, 2 * (size_t)N, COMM_FP32, COMM_SUM);
    vocab_loss_grad(logits, losses, weights, targets, maxes, sums, dloss, N, Vs, v0, V, write_dlogits);
}
