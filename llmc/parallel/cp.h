// Context parallelism (the lecture "LLM Pre-training and Beyond", "CP ~ Ring Attention";
// Megatron's context parallel, Liu et al.
// 2023 "Ring Attention"): the sequence is split over the cp ranks, each holds T/cp tokens of every
// sequence of the micro-batch, in every activation. Everything but attention works token by
// token and needs nothing from the other ranks; attention needs, for each query, every earlier
// key and value. Three ways to get them (--cp-algo), all exact:
//
//   ring       the key/value blocks travel around the cp ring, one neighbour exchange per step,
//              overlapped with the attention on the block in hand (cp = 4, rank r, step j holds
//              the block of rank r - j):
//                  step 0       step 1       step 2       step 3
//              r0  Q0.KV0       Q0.KV3       Q0.KV2       Q0.KV1        every rank sends its block
//              r1  Q1.KV1       Q1.KV0       Q1.KV3       Q1.KV2        to r+1 and receives from
//              r2  Q2.KV2       Q2.KV1       Q2.KV0       Q2.KV3        r-1 while it computes
//              r3  Q3.KV3       Q3.KV2       Q3.KV1       Q3.KV0
//   allgather  all-gather every rank's keys and values first, then the same blocks without
//              waiting (Llama 3's choice: simple, the whole sequence's K, V in memory)
//   alltoall   DeepSpeed-Ulysses: an all-to-all turns "T/cp tokens, all heads" into "all T tokens,
//              NH/cp heads", plain attention per head, and an all-to-all back
//
// The merge (ring, allgather): attention over the keys of block a gives, per query row and head,
// the normalised output O_a and lse_a = log sum_j exp(s_j) over the block's visible keys; two
// blocks combine exactly (the online softmax's rule, in log-sum-exp form):
//   m = max(lse_a, lse_b),  w_a = exp(lse_a - m),  w_b = exp(lse_b - m)        (the max correction)
//   O = (w_a O_a + w_b O_b) / (w_a + w_b),   lse = m + log(w_a + w_b)
// Backward, with the final O and lse saved: D_i = dO_i . O_i, P_ij = exp(s_ij - lse_i),
//   dS_ij = P_ij (dO_i . v_j - D_i),  dQ_i = scale sum_j dS_ij k_j,  dK_j = scale sum_i dS_ij q_i,
//   dV_j = sum_i P_ij dO_i  -- block by block; the key/value gradients of a block travel the ring
//   behind the block and reach its owner after cp - 1 hops (allgather: one reduce-scatter).
//
// Causal mask and load balance: query i sees key j when pos(j) <= pos(i), with global positions.
// A block entirely in the future is skipped. With the plain split (rank r: tokens [r T/cp,
// (r+1) T/cp)) rank r computes r full blocks and one half: the last rank does ~2cp - 1 times the
// first's work. The zigzag split cuts the sequence into 2cp chunks and gives rank r chunks r and
// 2cp-1-r: every rank then computes 2cp-1 full chunk pairs and two halves, the same work.
//
//        chunks   0  1  2  3  4  5  6  7           (cp = 4, zigzag)
//        rank     0  1  2  3  3  2  1  0
//
// Cost per layer and micro-batch, per rank, E = B (T/cp) C/tp elements, a = sizeof(floatX):
//   ring       forward (cp-1) 2E a             backward (cp-1) 2E a + (cp-1) 2E 4  (dK, dV in fp32)
//   allgather  forward (cp-1) 2E a (ring)      backward (cp-1) 2E a + (cp-1) 2E 4  (gather again, reduce-scatter)
//   alltoall   forward (cp-1)/cp 4E a          backward (cp-1)/cp 4E a             (q, k, v in; out back)
// Memory: activations are divided by cp (T/cp tokens). The attention keeps per layer O in fp32
// and lse (ring, allgather), or the gathered q, k, v of its heads and the kernel's state
// (alltoall). Scratch: ring two K,V blocks and four fp32 dK,dV blocks; allgather the whole
// sequence's K, V and their fp32 gradients; alltoall the send and receive buffers.
//
// Positions are global (the embedding reads this rank's, model->positions). The step is wrapped:
// each micro-batch (B x T tokens from the task) becomes this rank's B x T/cp tokens, and dloss is
// multiplied by cp, so each rank's loss is the mean over its own tokens and the average over the
// dp x cp group (llmc/parallel/mesh.h's dp_cp, the group data parallelism reduces over) is the
// mean over all tokens, as Megatron averages over its data-and-context group.
//
// Files: cp_core.h (state, splits, communication), cp_ring.h (ring and allgather), cp_ulysses.h
// (alltoall), this one (the op in the model, the step, what the trainer prints).
#pragma once

#include "cp_ring.h"
#include "cp_ulysses.h"

// floats of state per layer (B sequences of this rank's Tl tokens, C channels, NH heads: local to tp)
static inline size_t cp_state_size(void* ctx, int B, int T, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    if (T != cp->Tl) { die("context parallelism: attention on %d tokens per sequence, the split was made for %d", T, cp->Tl); }
    if (cp->algo == CP_ALLTOALL) {
        size_t qkv = ceil_div((size_t)B * cp->T * 3 * (C / cp->cp) * sizeof(floatX), sizeof(float));
        return cp_a2a_att_floats(cp, B, NH) + ceil_div(qkv, 4) * 4;   // each layer's state 16-byte aligned
    }
    return (size_t)B * T * C + (size_t)B * NH * T;   // O fp32, lse
}

// ---------------------------------------------------------------------------------------
// The step, wrapped: micro-batch i of the task (B x T) becomes this rank's B x Tl tokens.

static inline void cp_slice(ContextParallel* cp, const MicroBatch* mb, int slot, MicroBatch* out) {
    if (mb->T != cp->T) {
        die("context parallelism: a micro-batch of %d tokens per sequence, the split was made for %d", mb->T, cp->T);
    }
    if ((int)cp->inputs.size() <= slot) {
        cp->inputs.resize(slot + 1);
        cp->targets.resize(slot + 1);
        cp->weights.resize(slot + 1);
    }
    size_t n = (size_t)mb->B * cp->Tl;
    std::vector<int>& in = cp->inputs[slot];
    std::vector<int>& tg = cp->targets[slot];
    std::vector<float>& w = cp->weights[slot];
    in.resize(n);
    tg.resize(n);
    w.resize(mb->weights ? n : 0);
    for (int b = 0; b < mb->B; b++) {
        for (int g = 0; g < cp->nseg; g++) {
            size_t src = (size_t)b * cp->T + cp_seg_pos(cp, cp->rank, g), dst = (size_t)b * cp->Tl + (size_t)g * cp->L;
            memcpy(&in[dst], mb->inputs + src, cp->L * sizeof(int));
            memcpy(&tg[dst], mb->targets + src, cp->L * sizeof(int));
            if (mb->weights) { memcpy(&w[dst], mb->weights + src, cp->L * sizeof(float)); }
        }
    }
    *out = MicroBatch{in.data(), tg.data(), mb->weights ? w.data() : NULL, mb->B, cp->Tl};
}

static inline MicroBatch cp_micro_batch(void* ctx, int i) {
    ContextParallel* cp = (ContextParallel*)ctx;
    MicroBatch whole = cp->outer.get(cp->outer.ctx, i), mine;
    cp_slice(cp, &whole, i, &mine);
    return mine;
}

// dloss x cp: each rank's loss (and gradient) is the mean over its own tokens; data parallelism
// averages over the dp x cp group, which makes it the mean over all tokens
static inline float cp_run(void* ctx, GPT2* model, const MicroBatchSource* batches, int n, float dloss) {
    ContextParallel* cp = (ContextParallel*)ctx;
    cp->outer = *batches;
    MicroBatchSource mine = {cp, cp_micro_batch};
    return cp->inner.run(cp->inner.ctx, model, &mine, n, dloss * cp->cp);
}

// evaluation: the sum over this rank's tokens (the plan sums over the dp x cp group)
static inline double cp_loss(void* ctx, GPT2* model, const MicroBatch* mb) {
    ContextParallel* cp = (ContextParallel*)ctx;
    MicroBatch mine;
    cp_slice(cp, mb, GPT2_MAX_SLOTS, &mine);
    return step_loss(&cp->inner, model, &mine);
}

static inline GPT2Step cp_step(ContextParallel* cp, GPT2Step inner) {
    cp->inner = inner;
    GPT2Step s = {"context parallel", cp, cp_run, cp_loss};
    return s;
}

// ---------------------------------------------------------------------------------------
// Set-up: the attention op, the positions, the activations again (the op's state size), scratch

static inline void cp_check(const GPT2* model, int cp, CPAlgo algo, int zigzag, int T) {
    int parts = zigzag ? 2 * cp : cp, NH = model->config.num_heads / model->place.tp;
    if (T % parts != 0) {
        die("context parallelism: the sequence length %d is not divisible by %d (%s)", T, parts,
            zigzag ? "2 cp chunks for the zigzag split" : "cp");
    }
    if (algo == CP_ALLTOALL && NH % cp != 0) {
        die("--cp-algo alltoall splits the %d heads%s over cp %d: not divisible", NH, model->place.tp > 1 ? " of a tp rank" : "", cp);
    }
}

// the model's attention entry becomes the cp op (its state has its own size: the activations
// are sized again after this)
static inline void cp_install_op(ContextParallel* cp, GPT2* model) {
    model->ops.attention.ctx = cp;
    model->ops.attention.state_size = cp_state_size;
    model->ops.attention.forward = cp->algo == CP_ALLTOALL ? cp_a2a_forward : cp_merge_forward;
    model->ops.attention.backward = cp->algo == CP_ALLTOALL ? cp_a2a_backward : cp_merge_backward;
}

// The op installed in the model: its positions, its attention entry, the activations again (the
// state the op saves has its own size)
static inline void cp_init(ContextParallel* cp, GPT2* model, Comm* comm, CPAlgo algo, int zigzag, int T, int use_ring) {
    cp_check(model, comm->size, algo, zigzag, T);
    if (model->max_T != T / comm->size) {
        die("context parallelism: activations for %d tokens, a rank holds %d", model->max_T, T / comm->size);
    }
    cp_setup(cp, comm, algo, zigzag, T, model->max_B, gpt2_local_attn(model), gpt2_local_heads(model), use_ring);
    cp->model = model;
    int B = model->max_B, Tl = cp->Tl;
    std::vector<int> pos((size_t)B * Tl);   // this rank's positions, the same in every sequence
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < cp->nseg; g++) {
            for (int i = 0; i < cp->L; i++) { pos[(size_t)b * Tl + g * cp->L + i] = cp_seg_pos(cp, cp->rank, g) + i; }
        }
    }
    cp->positions = (int*)device_malloc(pos.size() * sizeof(int));
    copy_host_to_device(cp->positions, pos.data(), pos.size() * sizeof(int));
    model->positions = cp->positions;
    cp_install_op(cp, model);
    gpt2_allocate_activations_slots(model, model->max_B, model->max_T, model->num_slots);
}

// ---------------------------------------------------------------------------------------
// What it prints: the split, the work per rank, memory, and each step's bytes against the formula

// bytes this rank sends per layer and micro-batch of B sequences (the header's table), attention
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
    if (cp->zigzag) { printf(" (chunks r and %d-r of %d tokens)\n", 2 * cp->cp - 1, cp->L); }
    else { printf(" (block r of %d tokens)\n", cp->L); }
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
