// Context parallelism's numbers: the attention work each rank does, the bytes each algorithm
// sends, the memory, and what the trainer prints about them (the plan, and a line per step
// with the bytes counted against the formula). The planner (llmc/planner/cost_model.h) predicts
// with the same formulas.
//
// Cost per layer and micro-batch, per rank, E = B (T/cp) C/tp elements, a = sizeof(floatX):
//   ring       forward (cp-1) 2E a             backward (cp-1) 2E a + (cp-1) 2E 4  (dK, dV in fp32)
//   allgather  forward (cp-1) 2E a (ring)      backward (cp-1) 2E a + (cp-1) 2E 4  (gather again, reduce-scatter)
//   alltoall   forward (cp-1)/cp 4E a          backward (cp-1)/cp 4E a             (q, k, v in; out back)
// --recompute runs the attention's forward once more in the backward: one more forward's bytes.
// Memory: activations are divided by cp (T/cp tokens). The attention keeps per layer O in fp32
// and lse (ring, allgather), or the gathered q, k, v of its heads and the kernel's state
// (alltoall). Scratch: ring two K,V blocks and four fp32 dK,dV blocks; allgather the whole
// sequence's K, V and their fp32 gradients; alltoall the send and receive buffers.
// Work: the (query, key) pairs a rank's forward computes per layer, sequence and head
// (cp_rank_pairs); zigzag makes them equal on every rank, the plain split does not.
#pragma once

#include "cp_core.h"

// the pairs rank r computes in one layer's forward, per sequence and head (what the trainer prints)
static inline double cp_rank_pairs(const ContextParallel* cp, int r) {
    double n = 0;
    for (int s = 0; s < cp->cp; s++) {
        for (int qs = 0; qs < cp->nseg; qs++) {
            for (int ks = 0; ks < cp->nseg; ks++) { n += cp_pairs(cp_seg_pos(cp, r, qs), cp_seg_pos(cp, s, ks), cp->Tseg); }
        }
    }
    return n;
}

// bytes this rank sends per layer and micro-batch of B sequences (the table above), attention
// of C channels on this rank (tp's share); without a model (test/test_cp_attention.cu)
static inline uint64_t cp_formula_layer_bytes_for(const ContextParallel* cp, int B, int C) {
    uint64_t E = (uint64_t)B * cp->Tl * C, a = sizeof(floatX), p = cp->cp;
    // --recompute reruns the attention's forward (no model: the op alone, as test_cp_attention runs it)
    uint64_t again = cp->model && cp->model->recompute != RECOMPUTE_NONE ? 1 : 0;
    if (cp->algo == CP_ALLTOALL) { return (2 + again) * (p - 1) * (4 * E / p) * a; }   // forward + backward
    return (p - 1) * 2 * E * a * (2 + again) + (p - 1) * 2 * E * 4;
}
static inline uint64_t cp_formula_layer_bytes(const ContextParallel* cp, int B) {
    return cp_formula_layer_bytes_for(cp, B, gpt2_local_attn(cp->model));
}
// a step: every layer of this rank (its pipeline stage's), every micro-batch
static inline uint64_t cp_formula_bytes(const ContextParallel* cp, int micro, int B) {
    return cp_formula_layer_bytes(cp, B) * gpt2_local_layers(cp->model) * micro;
}

static inline void cp_step_begin(ContextParallel* cp) {
    cp->step_bytes_start = cp->comm->bytes_sent;
    cp->seconds = 0.0;
    cp->calls = 0;
    cp->pairs_step = 0.0;
}

static inline void cp_print_plan(const ContextParallel* cp) {
    const GPT2* m = cp->model;
    printf("context parallel cp %d, %s split, %s attention: %d of %d tokens per sequence on each rank", cp->cp,
           cp->zigzag ? "zigzag" : "plain", CP_ALGO_NAMES[cp->algo], cp->Tl, cp->T);
    if (cp->zigzag) { printf(" (chunks r and %d-r of %d tokens)\n", 2 * cp->cp - 1, cp->Tseg); }
    else { printf(" (block r of %d tokens)\n", cp->Tseg); }
    // the attention work of every rank, per layer, sequence and head: (query, key) pairs
    std::vector<double> pairs(cp->cp);
    for (int r = 0; r < cp->cp; r++) { pairs[r] = cp_rank_pairs(cp, r); }
    if (cp->algo == CP_ALLTOALL) {   // whole sequences, NH/cp heads: T(T+1)/2 / cp per model head
        for (int r = 0; r < cp->cp; r++) { pairs[r] = (double)cp->T * (cp->T + 1) / 2 / cp->cp; }
    }
    double lo = *std::min_element(pairs.begin(), pairs.end()), hi = *std::max_element(pairs.begin(), pairs.end());
    int hs = m->config.channels / m->config.num_heads;
    printf("  attention work per rank  (query, key) pairs per layer, sequence and head:");
    for (int r = 0; r < cp->cp; r++) { printf(" r%d %.0f", r, pairs[r]); }
    printf("  | max/min %.3f | forward %.3f MFLOP per layer (4 hs pairs NH B, rank 0)\n", hi / lo,
           4.0 * hs * pairs[0] * gpt2_local_heads(m) * m->max_B * 1e-6);
    printf("  cp comm      %s on the cp group; formula per layer and micro-batch %.3f MiB (%s)\n",
           cp->algo == CP_RING ? "ring exchanges (bytes counted)"
                               : (cp->use_ring ? "our collectives (bytes counted)" : "native collectives (bytes not counted)"),
           cp_formula_layer_bytes(cp, m->max_B) / 1048576.0,
           cp->algo == CP_ALLTOALL ? "2 (cp-1)/cp 4E a" : "(cp-1) (2E a fwd + 2E a + 2E 4 bwd)");
}

static inline void cp_print_memory(const ContextParallel* cp) {
    const GPT2* m = cp->model;
    size_t state = gpt2_attention_state_size(m, m->max_B, m->max_T) * sizeof(float) * gpt2_slot_layers(m) * m->num_slots;
    printf("  cp memory    activations %.3f MiB for %d tokens per sequence (of which attention state %.3f MiB), "
           "cp scratch %.3f MiB\n", m->acts_requested / 1048576.0, cp->Tl, state / 1048576.0, cp->scratch_bytes / 1048576.0);
}

// the line under each step's line; every rank of the group checks the bytes, rank 0 prints
static inline void cp_report_step(ContextParallel* cp, int micro, int B) {
    uint64_t sent = cp->comm->bytes_sent - cp->step_bytes_start, want = cp_formula_bytes(cp, micro, B);
    int counted = cp->algo == CP_RING || cp->use_ring;
    std::vector<double> pairs(cp->cp);
    MPI_Allgather(&cp->pairs_step, 1, MPI_DOUBLE, pairs.data(), 1, MPI_DOUBLE, cp->comm->mpi);
    double lo = *std::min_element(pairs.begin(), pairs.end()), hi = *std::max_element(pairs.begin(), pairs.end());
    if (counted) {
        printf("  cp comm | sent %9.3f MiB by this rank (formula %9.3f MiB, %s) | %d calls, %.1f ms not hidden", sent / 1048576.0,
               want / 1048576.0, sent == want ? "equal" : "DIFFERENT", cp->calls, cp->seconds * 1e3);
    } else {
        printf("  cp comm | native: bytes not counted (formula %9.3f MiB) | %d calls, %.1f ms", want / 1048576.0, cp->calls,
               cp->seconds * 1e3);
    }
    printf(" | attention pairs per rank max/min %.3f\n", lo > 0 ? hi / lo : 0.0);
}
