// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; the lecture "LLM Pre-training and
// Beyond"): the tp ranks of a mesh row
// split every matrix of the block, so each holds 1/tp of the weights and does 1/tp of their FLOPs.
//
//   attention:  x ─f─> [qkv: my NH/tp heads] ─> attention on my heads ─> [attproj: my C/tp rows] ─g─> + x
//   MLP:        x ─f─> [fc: my 4C/tp columns] ─> GELU ─────────────────> [fcproj: my 4C/tp rows] ─g─> + x
//     f: identity forward, all-reduce backward        g: all-reduce forward, identity backward
//
// Column-parallel (qkv, fc, the LM head): Y = X A, A split by output columns, A = [A_1 .. A_tp];
//   rank t computes Y_t = X A_t, its slice of Y, with no communication; its bias splits with A.
//   Every rank needs the whole X: f is the identity forward; backward, dX = sum_t dY_t A_t^T is a
//   sum of the ranks' parts: f all-reduces it.
// Row-parallel (attproj, fcproj): Z = Y B, B split by input rows; rank t holds Y_t (the output
//   of its column-parallel layer, or its heads' attention) and computes the partial Z_t = Y_t B_t;
//   Z = sum_t Z_t: g all-reduces. The bias must be added once: rank 0 adds it to its part.
//   Backward: dY_t = dZ B_t^T needs only the whole dZ, which every rank has (g: identity).
// Attention needs no communication: qkv is split by heads (llmc/model/params.h, SHARD_HEADS), and each
// head attends on its own. Between the two halves the residual stream is whole on every rank.
//
// Per block and micro-step: 2 all-reduces forward (g, g), 2 backward (f, f), each of the B T C
// activations; with the embedding's (forward) and the LM head's (backward) that is, per rank
// with ring all-reduces of a bytes per element,
//     bytes = (4 L + 2) * 2 (tp-1)/tp * B T C a  +  2 (tp-1)/tp * 3 B T * 4   (the loss: vocab.h)
// Sequence parallelism (sp.h) turns f and g into all-gather / reduce-scatter pairs (the same
// bytes) and adds one all-gather per column-parallel layer in the backward (2 L + 1 of them):
//     bytes = (4 L + 2) * 2 (tp-1)/tp * B T C a + (2 L + 1) (tp-1)/tp * B T C a + (loss)
//             + 2 (tp-1)/tp * (layernorm gradients this rank updates) a, once per step.
// tp_formula_bytes gives the exact figures (uneven blocks included); the trainer prints them
// beside the counted bytes every step.
//
// Memory per rank: parameters (and their gradients, AdamW state) of the local table,
//     Psi_tp = Vs C + maxT C + L (12 C^2 / tp + 7 C / tp + 6 C) + 2 C
// (Vs = Vp/tp: the rows of wte a rank holds, more where tp does not divide Vp: vocab.h; the
// 6 C per layer are the layernorms and the row-parallel biases, replicated), and the
// activations (gpt2_allocate_activations_slots), per layer and micro-batch slot:
//     B Ts (6 C a + 16)  +  B T 12 C a / tp  +  attention state of NH/tp heads (4 bytes each)
// with Ts = T (TP) or T/tp (SP): the 6 C (ln1, attproj, residual2, ln2, fcproj, residual3) and
// the layernorm statistics are the replicated part that only SP divides by tp (Korthikanti et
// al.'s sbh(34/t) ... for their block: the same split between the two terms).
#pragma once

#include "tp_core.h"
#include "sp.h"
#include "vocab.h"
#include "dp_core.h"   // ShardGroup: what the data-parallel update asks of the tp group

// ---------------------------------------------------------------------------------------
// Plain TP's region operators: f and g

static inline const floatX* tp_f_forward(TensorParallel* tp, const OpAt* at, const floatX* x, int C) {
    (void)tp; (void)at; (void)C;
    return x;   // identity: every rank already has the whole x
}
static inline floatX* tp_f_grad_buffer(TensorParallel* tp, floatX* dx) {
    (void)tp;
    return dx;
}
static inline void tp_f_backward(TensorParallel* tp, const OpAt* at, floatX* dx_full, floatX* dx, int C) {
    (void)dx;   // the same buffer: the sum lands in place
    tp_allreduce(tp, "TP f backward: all-reduce", dx_full, tp_full_count(at, C), COMM_FLOATX, COMM_SUM);
}
static inline floatX* tp_g_partial_buffer(TensorParallel* tp, floatX* y) {
    (void)tp;
    return y;
}
static inline void tp_g_forward(TensorParallel* tp, const OpAt* at, floatX* y_full, floatX* y, int C) {
    (void)y;
    tp_allreduce(tp, "TP g: all-reduce", y_full, tp_full_count(at, C), COMM_FLOATX, COMM_SUM);
}
static inline const floatX* tp_g_backward(TensorParallel* tp, const OpAt* at, const floatX* dy, int C) {
    (void)tp; (void)at; (void)C;
    return dy;   // identity: every rank has the whole dZ
}

static const TPRegion TP_REGION_TP = {
    "TP", "f (identity / all-reduce)", "g (all-reduce / identity)",
    tp_f_forward, tp_f_grad_buffer, tp_f_backward,
    tp_g_partial_buffer, tp_g_forward, tp_g_backward,
};

// The stream holds all the tokens (TP, and generation) or 1/tp of them (SP)
static inline const TPRegion* tp_region(const OpAt* at) { return at->Ts < at->T ? &TP_REGION_SP : &TP_REGION_TP; }

// ---------------------------------------------------------------------------------------
// The linear entries (llmc/model/ops.h): column-parallel at qkv, fc and the LM head, row-parallel at
// attproj and fcproj. C and OC are this rank's local sizes (C/tp inputs for a row-parallel one).

static inline int tp_column_parallel(int site) { return site == LINEAR_QKV || site == LINEAR_FC || site == LINEAR_LM_HEAD; }

static inline void tp_linear_forward(void* ctx, const OpAt* at, int site, floatX* out, const floatX* inp, const floatX* w,
                                     const floatX* bias, int C, int OC) {
    TensorParallel* tp = (TensorParallel*)ctx;
    const TPRegion* R = tp_region(at);
    if (tp_column_parallel(site)) {
        const floatX* x = R->enter_forward(tp, at, inp, C);    // f / g: the whole input
        matmul_forward(out, x, w, bias, at->B, at->T, C, OC);  // my output columns, my bias slice
    } else {
        floatX* partial = R->exit_partial_buffer(tp, out);
        matmul_forward(partial, inp, w, tp->rank == 0 ? bias : NULL, at->B, at->T, C, OC);   // my part of the sum
        R->exit_forward(tp, at, partial, out, OC);              // g / g-bar: the sum over tp
    }
}

static inline void tp_linear_backward(void* ctx, const OpAt* at, int site, floatX* dinp, floatX* dw, floatX* dbias,
                                      const floatX* dout, const floatX* inp, const floatX* w, int C, int OC) {
    TensorParallel* tp = (TensorParallel*)ctx;
    const TPRegion* R = tp_region(at);
    if (tp_column_parallel(site)) {
        const floatX* x = R->enter_forward(tp, at, inp, C);    // SP: gather the input again (not kept)
        if (dinp == NULL) {   // the zero-bubble W pass: the weight gradient only, no communication
            matmul_backward(NULL, dw, dbias, dout, x, w, at->B, at->T, C, OC);
            return;
        }
        floatX* dx = R->enter_grad_buffer(tp, dinp);
        matmul_backward(dx, dw, dbias, dout, x, w, at->B, at->T, C, OC);   // dx: my part of dX
        R->enter_backward(tp, at, dx, dinp, C);                 // f / g backward: sum over tp
    } else {
        const floatX* dy = R->exit_backward(tp, at, dout, OC);  // the whole dZ
        matmul_backward(dinp, dw, dbias, dy, inp, w, at->B, at->T, C, OC);
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

static inline void tp_step_begin(TensorParallel* tp) {
    tp->step_bytes_start = tp->comm->bytes_sent;
    tp->seconds = 0.0;
    tp->calls = 0;
}
static inline uint64_t tp_step_bytes(const TensorParallel* tp) { return tp->comm->bytes_sent - tp->step_bytes_start; }

// ---------------------------------------------------------------------------------------
// What the formulas predict

// bytes this rank sends on the tp group in one optimizer step of `micro` micro-steps of B x T
// tokens, of which `norm_elems` layernorm gradient elements are summed before the update (SP)
static inline uint64_t tp_formula_bytes(const TensorParallel* tp, int micro, int B, int T, size_t norm_elems) {
    int p = tp->tp, r = tp->rank;
    const GPT2Place* pl = &tp->model->place;
    size_t L = (size_t)gpt2_local_layers(tp->model), X = (size_t)B * T * tp->model->config.channels, BT = (size_t)B * T;
    // an MoE block (llmc/model/moe.h) has the attention's two regions; its MLP's two are inside each expert
    size_t Lm = tp->model->moe ? (size_t)tp->model->moe->blocks : 0;
    // regions: 4 per block, the embedding's exit and the LM head's entry where this (pipeline) stage has them
    size_t regions = 4 * L - 2 * Lm + (pl->has_embedding ? 1 : 0) + (pl->has_head ? 1 : 0);
    uint64_t per_micro = regions * allreduce_ring_volume(X, COMM_FLOATX, p, r).bytes;   // f, g (or their SP pairs)
    if (tp->sp) {   // SP: reduce-scatter + all-gather instead of each all-reduce, and the re-gathers
        per_micro = regions * (reduce_scatter_ring_volume(X, COMM_FLOATX, p, r).bytes +
                               allgather_ring_volume(X, COMM_FLOATX, p, r).bytes) +
                    (2 * L + (pl->has_head ? 1 : 0)) * allgather_ring_volume(X, COMM_FLOATX, p, r).bytes;
    }
    if (tp->model->recompute == RECOMPUTE_FULL) {   // --recompute full: the forward's exits (g) and entries (f)
        // once more in the backward, per block half (an MoE block reruns its attention half only)
        uint64_t half = tp->sp ? reduce_scatter_ring_volume(X, COMM_FLOATX, p, r).bytes + allgather_ring_volume(X, COMM_FLOATX, p, r).bytes
                               : allreduce_ring_volume(X, COMM_FLOATX, p, r).bytes;
        per_micro += (2 * L - Lm) * half;
    }
    if (pl->has_head) {   // the vocabulary-parallel loss's statistics
        per_micro += allreduce_ring_volume(BT, COMM_FP32, p, r).bytes + allreduce_ring_volume(2 * BT, COMM_FP32, p, r).bytes;
    }
    uint64_t experts = 0;   // each expert call: g after its fcproj (forward), f before its fc (backward), on its rows
    if (Lm) {
        for (int n : tp->model->moe->step_expert_calls) {
            experts += 2 * allreduce_ring_volume((size_t)n * tp->model->config.channels, COMM_FLOATX, p, r).bytes;
        }
    }
    return (uint64_t)micro * per_micro + experts + (tp->sp ? allreduce_ring_volume(norm_elems, COMM_FLOATX, p, r).bytes : 0);
}

// parameters of this rank's table, in closed form (the formula in the header); a pipeline stage
// (llmc/parallel/pp.h) holds its L layers, wte only with the embedding or the head, wpe only
// with the embedding, lnf only with the head
static inline size_t tp_formula_params(const GPT2* m) {
    const GPT2Config* c = &m->config;
    const GPT2Place* p = &m->place;
    size_t tp = (size_t)p->tp, C = (size_t)c->channels, L = (size_t)gpt2_local_layers(m);
    size_t Lm = m->moe ? (size_t)m->moe->blocks : 0, E = (size_t)c->num_experts, El = E / (size_t)p->ep;
    // an MoE block: the attention's 4 C^2/tp + 3 C/tp + 5 C, the router E C, and El experts' 8 C^2/tp + 4 C/tp + C
    size_t moe_block = 4 * C * C / tp + 3 * C / tp + 5 * C + E * C + El * moe_expert_params(c, (int)tp);
    return (p->has_embedding || p->has_head ? (size_t)gpt2_local_vocab(m) * C : 0) +
           (p->has_embedding ? (size_t)c->max_seq_len * C : 0) + (L - Lm) * (12 * C * C / tp + 7 * C / tp + 6 * C) +
           Lm * moe_block + (p->has_head ? 2 * C : 0);
}

// activation bytes of `slots` slots of B x T tokens, in closed form; a slot holds Ls layers
// (the stage's, or one interleaved chunk's), logits only where the stage has the head
static inline size_t tp_formula_activations(const GPT2* m, int B, int T, int slots) {
    if (m->recompute != RECOMPUTE_NONE) { return gpt2_activation_formula(m, B, T, slots).total; }   // llmc/model/gpt2.h's, per mode
    const GPT2Config* c = &m->config;
    size_t tp = (size_t)m->place.tp, C = (size_t)c->channels, Ls = (size_t)gpt2_slot_layers(m), a = sizeof(floatX);
    size_t BT = (size_t)B * T, BTs = (size_t)B * gpt2_place_stream_tokens(&m->place, T), Vs = (size_t)gpt2_local_vocab(m);
    size_t per_layer = BTs * (6 * C * a + 16) + BT * 12 * C / tp * a + gpt2_attention_state_size(m, B, T) * 4;
    size_t per_slot = Ls * per_layer
                      + BTs * (2 * C * a + 8)                 // encoded, lnf and its statistics
                      + (m->place.has_head ? BT * Vs * a : 0) // logits
                      + BT * 16;                              // losses, inputs, targets, loss weights
    size_t shared = BTs * 2 * C * a + BT * 8 * C / tp * a;   // backward buffers: dresidual, dln | datty, dqkv, dfch
    return (size_t)slots * per_slot + shared;
}

// The tp lines of the memory table (rank 0 prints, every rank checks). Returns 1 when all match.
static inline int tp_print_memory(const TensorParallel* tp) {
    const GPT2* m = tp->model;
    size_t psi = tp_formula_params(m), acts = tp_formula_activations(m, m->max_B, m->max_T, m->num_slots);
    int ok = psi == m->num_parameters && acts == m->acts_requested;
    int all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, tp->comm->mpi);
    printf("tensor parallel tp %d%s: Psi per rank %zu of %zu (formula Vs C + maxT C + L (12 C^2/tp + 7 C/tp + 6 C) + 2 C "
           "= %zu)\n", tp->tp, tp->sp ? " + sequence parallel" : "", m->num_parameters, m->num_parameters_full, psi);
    printf("  activations per rank     %9.3f MiB  (formula %9.3f MiB: L [B Ts (6 C a + 16) + B T 12 C a/tp + attention] + ..., "
           "Ts = %d)\n", m->acts_requested / 1048576.0, acts / 1048576.0, gpt2_place_stream_tokens(&m->place, m->max_T));
    printf("  tp buffers               %9.3f MiB  (%s)\n", tp->scratch_bytes / 1048576.0,
           tp->sp ? "loss statistics 3 B T floats, a row of Vp logits, 2 x B T C gathered" : "loss statistics 3 B T floats, a row of Vp logits");
    printf("tp memory check %s (measured %s formula on all %d ranks of the group)\n", all_ok ? "ok" : "FAILED",
           all_ok ? "=" : "!=", tp->tp);
    return all_ok;
}

static inline void tp_print_plan(const TensorParallel* tp) {
    const TPRegion* R = tp->sp ? &TP_REGION_SP : &TP_REGION_TP;
    printf("tp comm      %s collectives on the tp group: enter %s, exit %s%s\n",
           tp->use_ring ? "ring (ours: bytes counted)" : "native (bytes not counted)", R->enter_name, R->exit_name,
           tp->sp ? ", layernorm gradients summed before the update" : "");
}

// the line under each step's line
static inline void tp_report_step(const TensorParallel* tp, int micro, int B, int T, size_t norm_elems) {
    uint64_t sent = tp_step_bytes(tp), want = tp_formula_bytes(tp, micro, B, T, norm_elems);
    if (tp->use_ring) {
        printf("  tp comm | sent %9.3f MiB by this rank (formula %9.3f MiB, %s) | %d collectives, %.1f ms\n", sent / 1048576.0,
               want / 1048576.0, sent == want ? "equal" : "DIFFERENT", tp->calls, tp->seconds * 1e3);
    } else {
        printf("  tp comm | native: bytes not counted (ring formula %9.3f MiB) | %d collectives, %.1f ms\n", want / 1048576.0,
               tp->calls, tp->seconds * 1e3);
    }
}
