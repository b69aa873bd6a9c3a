// Context parallelism (the lecture "LLM Pre-training and Beyond", slides "Context Parallelism,
// CP" and "Transformer Layer with TP+CP"; Megatron-Core's context parallel): the sequence is
// split over the cp ranks, each holds T/cp tokens of every sequence of the micro-batch, in every
// activation. Everything but attention works token by token and needs nothing from the other
// ranks; attention needs, for each query, every earlier key and value. Three ways to get them
// (--cp-algo), all exact, each the model's attention op:
//
//   ring       cp_ring.h: the slide "CP ~ Ring Attention" (Liu et al. 2023). Key/value blocks
//              travel the ring, one neighbour exchange per step, behind the attention on the
//              block in hand; the partial results merge by online softmax. Start there: it
//              opens with the picture, the zigzag split, the merge and the cost.
//   allgather  cp_allgather.h: the drawing "Transformer Layer with TP+CP" (AG of K,V before
//              attention, RS of their gradients after; Llama 3's choice): the same blocks,
//              gathered first.
//   alltoall   cp_ulysses.h: DeepSpeed-Ulysses (Jacobs et al. 2023, not on the slides): two
//              all-to-alls turn "T/cp tokens, all heads" into "all T tokens, NH/cp heads" and back.
//
// The step is wrapped: each micro-batch (B x T tokens from the task) becomes this rank's B x T/cp
// tokens, at their global positions (the embedding reads this rank's, model->positions), and
// dloss is multiplied by cp, so each rank's loss is the mean over its own tokens and the average
// over the dp x cp group (llmc/parallel/mesh.h's dp_cp, the group data parallelism reduces over)
// is the mean over all tokens, as Megatron averages over its data-and-context group.
//
// Files: cp_core.h (what a rank holds, the split, the cp group's calls), the three ops above,
// cp_accounting.h (work, bytes, memory, what the trainer prints), this one (the op in the model,
// the step wrapped, the scratch).
#pragma once

#include "cp_allgather.h"
#include "cp_ulysses.h"
#include "cp_accounting.h"

// floats of state per layer (B sequences of this rank's Tl tokens, C channels, NH heads: local to
// tp): the ring's and the all-gather's merged O fp32, then lse (the all-to-all's: cp_a2a_state_size)
static inline size_t cp_state_size(void* ctx, int B, int T, int C, int NH) {
    cp_check_tokens((ContextParallel*)ctx, T);
    return (size_t)B * T * C + (size_t)B * NH * T;
}
// the op's state_size entry for an algorithm (cp_install_op's; test_cp_attention sizes its state with it)
static inline auto cp_state_size_entry(CPAlgo algo) { return algo == CP_ALLTOALL ? cp_a2a_state_size : cp_state_size; }

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
            size_t src = (size_t)b * cp->T + cp_seg_pos(cp, cp->rank, g), dst = (size_t)b * cp->Tl + (size_t)g * cp->Tseg;
            memcpy(&in[dst], mb->inputs + src, cp->Tseg * sizeof(int));
            memcpy(&tg[dst], mb->targets + src, cp->Tseg * sizeof(int));
            if (mb->weights) { memcpy(&w[dst], mb->weights + src, cp->Tseg * sizeof(float)); }
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
// The split alone (rank `rank` of p), no communicator, no memory: what the formulas read; the
// planner (llmc/planner/cost_model.h) stops here
static inline void cp_shape(ContextParallel* cp, int p, int rank, CPAlgo algo, int zigzag, int T) {
    cp->comm = NULL;
    cp->cp = p;
    cp->rank = rank;
    cp->algo = algo;
    cp->zigzag = zigzag;
    cp->use_ring = 1;
    cp->model = NULL;
    cp->positions = NULL;
    cp->T = T;
    cp->Tl = T / cp->cp;
    cp->nseg = zigzag ? 2 : 1;
    cp->Tseg = cp->Tl / cp->nseg;
}

// The group, the split and the scratch for micro-batches of up to B sequences, attention of C
// channels and NH heads on this rank (tp's share): what the op needs (test/test_cp_attention.cu
// drives the op with this alone).
static inline void cp_setup(ContextParallel* cp, Comm* comm, CPAlgo algo, int zigzag, int T, int B, int C, int NH, int use_ring) {
    cp_shape(cp, comm->size, comm->rank, algo, zigzag, T);
    cp->comm = comm;
    cp->use_ring = use_ring;
    int Tl = cp->Tl;
    size_t E = (size_t)B * Tl * C, lseN = (size_t)B * NH * Tl;
    struct Buf { void** ptr; size_t bytes; };
    std::vector<Buf> bufs;
    memset(cp->kv, 0, sizeof(cp->kv));
    memset(cp->dkv, 0, sizeof(cp->dkv));
    memset(cp->a2a, 0, sizeof(cp->a2a));
    cp->kv_all = NULL;
    cp->dkv_all = NULL;
    cp->o_part = cp->lse_part = cp->delta = cp->dq = NULL;
    if (algo == CP_ALLTOALL) {
        for (int i = 0; i < 4; i++) { bufs.push_back({(void**)&cp->a2a[i], 3 * E * sizeof(floatX)}); }
    } else {
        bufs.push_back({(void**)&cp->kv[0], 2 * E * sizeof(floatX)});
        bufs.push_back({(void**)&cp->o_part, E * sizeof(float)});
        bufs.push_back({(void**)&cp->lse_part, lseN * sizeof(float)});
        bufs.push_back({(void**)&cp->delta, lseN * sizeof(float)});
        bufs.push_back({(void**)&cp->dq, E * sizeof(float)});
        bufs.push_back({(void**)&cp->dkv[0], 2 * E * sizeof(float)});
        if (algo == CP_RING) {
            bufs.push_back({(void**)&cp->kv[1], 2 * E * sizeof(floatX)});
            for (int i = 1; i < 4; i++) { bufs.push_back({(void**)&cp->dkv[i], 2 * E * sizeof(float)}); }
        } else {
            bufs.push_back({(void**)&cp->kv_all, cp->cp * 2 * E * sizeof(floatX)});
            bufs.push_back({(void**)&cp->dkv_all, cp->cp * 2 * E * sizeof(float)});
        }
    }
    size_t total = 0;
    for (const Buf& b : bufs) { total += ceil_div(b.bytes, 64) * 64; }
    cp->scratch = device_malloc(total);
    cp->scratch_bytes = total;
    char* p = (char*)cp->scratch;
    for (const Buf& b : bufs) { *b.ptr = p; p += ceil_div(b.bytes, 64) * 64; }
    cp->ready = backend_event_create();
    cp->seconds = 0.0;
    cp->calls = 0;
    cp->pairs = cp->pairs_step = 0.0;
    cp->step_bytes_start = comm->bytes_sent;
}

static inline void cp_free(ContextParallel* cp) {
    device_free(cp->scratch);
    if (cp->positions) { device_free(cp->positions); }
    backend_event_destroy(cp->ready);
    if (cp->model) { cp->model->positions = NULL; }
}

// ---------------------------------------------------------------------------------------
// Set-up: the attention op, the positions, the activations again (the op's state size)

static inline CPAlgo cp_algo_parse(const char* s) {
    for (int a = 0; a < 3; a++) { if (strcmp(s, CP_ALGO_NAMES[a]) == 0) { return (CPAlgo)a; } }
    die("--cp-algo must be ring, allgather or alltoall, got '%s'", s);
    return CP_RING;
}

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
    model->ops.attention.state_size = cp_state_size_entry(cp->algo);
    if (cp->algo == CP_RING) {
        model->ops.attention.forward = cp_ring_forward;
        model->ops.attention.backward = cp_ring_backward;
    } else if (cp->algo == CP_ALLGATHER) {
        model->ops.attention.forward = cp_allgather_forward;
        model->ops.attention.backward = cp_allgather_backward;
    } else {
        model->ops.attention.forward = cp_a2a_forward;
        model->ops.attention.backward = cp_a2a_backward;
    }
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
            for (int i = 0; i < cp->Tseg; i++) { pos[(size_t)b * Tl + g * cp->Tseg + i] = cp_seg_pos(cp, cp->rank, g) + i; }
        }
    }
    cp->positions = (int*)device_malloc(pos.size() * sizeof(int));
    copy_host_to_device(cp->positions, pos.data(), pos.size() * sizeof(int));
    model->positions = cp->positions;
    cp_install_op(cp, model);
    gpt2_allocate_activations_slots(model, model->max_B, model->max_T, model->num_slots);
}
