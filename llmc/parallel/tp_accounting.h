// Tensor parallelism's accounting: the bytes, parameters and activations the formulas predict,
// and the lines the trainer prints beside what it measured (the planner uses the same formulas).
//
// Bytes per rank and micro-step, with ring all-reduces of a bytes per element: per block 2
// all-reduces forward (g, g) and 2 backward (f, f) of the B T C activations, the embedding's
// (forward) and the LM head's (backward), and the loss's statistics (vocab.h):
//     bytes = (4 L + 2) * 2 (tp-1)/tp * B T C a  +  2 (tp-1)/tp * 3 B T * 4
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

#include "tp.h"

// ---------------------------------------------------------------------------------------
// What was measured: the bytes this rank sent on the tp group since the step began

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
    // an MoE block (llmc/model/moe_block.h) has the attention's f and g; its MLP's are inside each expert
    size_t Lm = tp->model->moe ? (size_t)tp->model->moe->blocks : 0;
    // f and g: 4 per block, the embedding's g and the LM head's f where this (pipeline) stage has them
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

// the collectives around every tensor-parallel layer: where the stream enters (before a
// column-parallel linear) and where it leaves (after a row-parallel one)
static inline void tp_print_plan(const TensorParallel* tp) {
    printf("tp comm      %s collectives on the tp group: enter %s, exit %s%s\n",
           tp->use_ring ? "ring (ours: bytes counted)" : "native (bytes not counted)",
           tp->sp ? "g (all-gather)" : "f (identity / all-reduce)", tp->sp ? "g-bar (reduce-scatter)" : "g (all-reduce / identity)",
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
