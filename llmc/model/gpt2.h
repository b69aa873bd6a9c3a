// GPT-2: the model, its passes in pieces, the placement hooks, the update. Backend-agnostic:
// every tensor lives in "device" memory (host memory on the CPU backend, GPU memory on CUDA)
// and this file only calls kernels, ops and copy functions on it, never reads it directly.
//
// Shapes: B batch, T sequence, C channels, NH heads, L layers, V vocab, Vp padded vocab, Vs the
// vocabulary rows a tp rank holds (gpt2_local_vocab: Vp/tp, or more where tp does not divide Vp).
// One transformer block (pre-LayerNorm, as GPT-2):
//   x = x + attproj( attention( qkv( ln1(x) ) ) )
//   x = x + mlp( ln2(x) ),   mlp(h) = fcproj( gelu( fc(h) ) )
// and around the blocks: x = wte[tokens] + wpe[positions] ... logits = lnf(x) @ wte^T (tied).
//
// The passes come in pieces a schedule calls on its own (llmc/train/step.h), each on a micro-batch
// SLOT (a pipeline keeps several micro-batches in flight; the default step uses slot 0):
//   forward:   gpt2_set_batch, gpt2_forward_begin, gpt2_embed_forward, gpt2_block_forward(l)...,
//              gpt2_head_forward, gpt2_head_loss
//   backward:  gpt2_backward_begin, gpt2_head_backward, gpt2_block_backward(l)... (last first),
//              gpt2_embed_backward, gpt2_backward_end
// gpt2_forward / gpt2_classifier / gpt2_backward are these pieces in order (one micro-batch).
// Sublayers run through model->ops (llmc/model/ops.h); where the weights and gradients live is up to
// the placement hooks (llmc/model/hooks.h); the table (llmc/model/params.h) says which shard this rank holds.
#pragma once

#include <string.h>
#include <vector>
#include "../common.h"
#include "../backend.h"
#include "../rand.h"
#include "params.h"
#include "ops.h"
#include "hooks.h"

// ---------------------------------------------------------------------------------------
// Activations saved by the forward pass for the backward pass, one set per slot ("L" marks
// one per layer of a slot: the stage's layers, or with an interleaved pipeline one chunk's, a
// slot then holding one micro-batch on one chunk). Sizes are local: Cq = 3C/tp, Ca = C/tp, H = 4C/tp, and
// the residual stream's tensors hold Ts tokens per sequence (T/tp under sequence parallelism:
// the layernorms, residual adds and what they read split along the sequence; llmc/model/ops.h).

#define GPT2_MAX_SLOTS 64

typedef struct {
    floatX* encoded;    // (B, Ts, C)       the slot's input: the embedding (or what the previous stage sent)
    floatX* ln1;        // L x (B, Ts, C)
    float* ln1_mean;    // L x (B, Ts)      layernorm statistics stay fp32 in every backend
    float* ln1_rstd;    // L x (B, Ts)
    floatX* qkv;        // L x (B, T, Cq)
    floatX* atty;       // L x (B, T, Ca)  attention output, before the projection
    float* att;         // L x attention_state_size(B, T, NH/tp)
    floatX* attproj;    // L x (B, Ts, C)
    floatX* residual2;  // L x (B, Ts, C)   x after the attention half of the block
    floatX* ln2;        // L x (B, Ts, C)
    float* ln2_mean;    // L x (B, Ts)
    float* ln2_rstd;    // L x (B, Ts)
    floatX* fch;        // L x (B, T, H)   fc output, before GELU
    floatX* fch_gelu;   // L x (B, T, H)
    floatX* fcproj;     // L x (B, Ts, C)
    floatX* residual3;  // L x (B, Ts, C)   x after the whole block
    floatX* lnf;        // (B, Ts, C)
    float* lnf_mean;    // (B, Ts)
    float* lnf_rstd;    // (B, Ts)
    int* inputs;        // (B, T) token ids, device copy
    int* targets;       // (B, T)
    float* loss_weights;// (B, T) optional per-token loss weights
    float* losses;      // (B, T)
    floatX* logits;     // (B, T, Vs) the head's output, then dlogits (only where the stage has the head)
    int B, T;           // shape of the micro-batch in this slot
    int chunk;          // which of the stage's chunks the slot holds (0 without interleaving)
    int Ts;             // its tokens per sequence on the residual stream (T, or T/tp with SP)
} ActivationTensors;

// One block's activations, wherever they are kept: a slot's layer l (training), or one
// scratch set reused by every layer (generation: gpt2_block_compute is shared by both).
typedef struct {
    floatX *residual, *ln1, *qkv, *atty, *attproj, *residual2, *ln2, *fch, *fch_gelu, *fcproj, *residual3;
    float *ln1_mean, *ln1_rstd, *att, *ln2_mean, *ln2_rstd;
} BlockActs;

// Activation recomputation (--recompute; doc/memory.md): what the forward keeps per
// layer for the backward, and what the backward of layer l rebuilds first, into ONE block's
// scratch set (GPT2.scratch) that every layer and slot shares (the backward runs one layer at a
// time, so one is enough, however many micro-batches a pipeline has in flight):
//   none       everything above, per layer
//   selective  not att (the attention's state: on the CPU the T x T probabilities of every head)
//              nor fch_gelu (the GELU's output): the backward reruns the attention op on the kept
//              qkv and the GELU on the kept fch (its input)
//   full       only the block's input (encoded, then each layer's residual3): the backward reruns
//              the block's forward (gpt2_block_compute's pieces, through the same ops, so tensor-
//              parallel linears communicate again, in lockstep on every rank, as in Megatron)
// The recomputed tensors come from the same kernels on the same inputs, so the gradients, and
// the losses, are bit-identical to no recomputation.
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } Recompute;
static inline const char* gpt2_recompute_name(int r) {
    return r == RECOMPUTE_FULL ? "full" : r == RECOMPUTE_SELECTIVE ? "selective" : "none";
}
static inline int gpt2_recompute_parse(const char* s) {
    if (s == NULL || strcmp(s, "none") == 0) { return RECOMPUTE_NONE; }
    if (strcmp(s, "selective") == 0) { return RECOMPUTE_SELECTIVE; }
    if (strcmp(s, "full") == 0) { return RECOMPUTE_FULL; }
    die("--recompute must be none, selective or full, got '%s'", s);
    return RECOMPUTE_NONE;
}

// Gradients of activations: only one layer's worth is alive at a time in the backward pass.
typedef struct {
    floatX* dresidual;  // (B, Ts, C) gradient of the residual stream, shared by both branches
    floatX* dln;        // (B, Ts, C) gradient of a layernorm output
    floatX* datty;      // (B, T, Ca)
    floatX* dqkv;       // (B, T, Cq)
    floatX* dfch;       // (B, T, H)  gradient of fch_gelu, then (in place) of fch
} GradientBuffers;

typedef struct GPT2 {
    GPT2Config config;
    GPT2Place place;                              // this rank's shard (llmc/model/params.h)
    ParamInfo param_info[NUM_PARAMETER_TENSORS];  // local shapes and offsets
    ParamInfo full_info[NUM_PARAMETER_TENSORS];   // the whole model's (the checkpoint's layout)
    size_t num_parameters;                        // local
    size_t num_parameters_full;
    floatX* params_memory;
    floatX* grads_memory;
    ParameterTensors params;
    ParameterTensors grads;
    // optimizer state: this rank updates parameters [opt_offset, opt_offset + opt_count) of the
    // flat buffer (all of them without ZeRO); the three arrays below have opt_count floats
    size_t opt_offset, opt_count;
    float* m_memory;            // AdamW first moment, allocated at the first update
    float* v_memory;            // AdamW second moment
    float* master_memory;       // fp32 master weights (only when floatX is narrower: CUDA bf16)
    int step;                   // AdamW t (number of updates done)
    int skip_nonfinite;         // --on-nan skip: an update whose gradient norm is not finite does nothing
    float loss_scale;           // S: the gradients hold S x the loss's gradient (llmc/train/loss_scale.h); 1 without scaling
    // activations: num_slots sets, each for up to max_B x max_T tokens
    int max_B, max_T, num_slots;
    ActivationTensors acts[GPT2_MAX_SLOTS];
    GradientBuffers bufs;
    int recompute;              // Recompute: what the forward keeps per layer (set before allocating the activations)
    int recomputing;            // 1 while the backward rebuilds a block (gpt2_block_recompute)
    BlockActs scratch;          // one block's buffers that recomputation rebuilds (NULL: kept per layer, or none)
    floatX* logits;             // slot 0's logits (acts[0].logits): what the one-micro-batch callers read
    void* acts_memory;
    size_t acts_bytes;          // allocated (each buffer rounded up to 64 bytes)
    size_t acts_requested;      // the sum of the buffers' sizes (what the memory formulas predict)
    float* norm_squared;        // 1 float: global_norm_squared output
    float* losses_host;         // host copy of losses
    int B, T;                   // shape of the last gpt2_forward (slot 0)
    int root_in_pass;           // the backward in flight touched the root tensors (head or embedding)
    int* positions;             // device (max_B, max_T): the positions of this rank's tokens, the same in
                                // every sequence (context parallelism's part of it), or NULL: 0..T-1
    // the extension points
    GPT2Ops ops;                // how sublayers are computed (llmc/model/ops.h)
    HookChain hooks;            // where weights and gradients live (llmc/model/hooks.h)
    ParameterTensors root, root_grads;  // the root tensors of the pass in flight (after the hooks)
    struct MoE* moe;            // mixture of experts (llmc/model/moe.h): routing state and buffers, NULL when dense
} GPT2;

#include "moe.h"   // the MoE block's MLP (needs GPT2)

// ---------------------------------------------------------------------------------------
// Placement hooks (llmc/model/hooks.h): installing and removing a table

static inline void gpt2_add_hooks(GPT2* model, const GPT2Hooks* h) { hooks_add(&model->hooks, h); }
static inline void gpt2_remove_hooks(GPT2* model, void* ctx) { hooks_remove(&model->hooks, ctx); }
static inline void gpt2_micro_begin(GPT2* model, int i, int n) {
    if (model->moe) { model->moe->micro_n = n; }   // the aux loss's gradient is a mean over the step
    hooks_micro_begin(&model->hooks, i, n);
}

// ---------------------------------------------------------------------------------------
// The default MLP entries: fc -> GELU -> fcproj through the model's linear entries.

// An MoE block's MLP is the experts (llmc/model/moe.h), all on this rank.
static const MoEExchange MOE_ONE_RANK = {NULL, 1, 0, NULL, NULL};

static inline void op_mlp_forward(void* ctx, const OpAt* at, MLPActs* a, const floatX* inp, const BlockWeights* w,
                                  int C, int H) {
    (void)ctx;
    if (gpt2_layer_is_moe(&at->model->config, at->layer)) { moe_forward(at->model, at, a->out, inp, w, C, H, &MOE_ONE_RANK); return; }
    const GPT2Ops* ops = &at->model->ops;
    ops->linear.forward(ops->linear.ctx, at, LINEAR_FC, a->fch, inp, w->fcw, w->fcb, C, H);
    gelu_forward(a->fch_gelu, a->fch, (size_t)at->B * at->T * H);
    ops->linear.forward(ops->linear.ctx, at, LINEAR_FCPROJ, a->out, a->fch_gelu, w->fcprojw, w->fcprojb, H, C);
}
static inline void op_mlp_backward(void* ctx, const OpAt* at, floatX* dinp, const floatX* dout, const MLPActs* a,
                                   const floatX* inp, const BlockWeights* w, BlockWeights* g, floatX* dh, int C, int H) {
    (void)ctx;
    if (gpt2_layer_is_moe(&at->model->config, at->layer)) {
        moe_backward(at->model, at, dinp, dout, inp, w, g, C, H, &MOE_ONE_RANK);
        return;
    }
    const GPT2Ops* ops = &at->model->ops;
    ops->linear.backward(ops->linear.ctx, at, LINEAR_FCPROJ, dh, g->fcprojw, g->fcprojb, dout, a->fch_gelu, w->fcprojw, H, C);
    gelu_backward(dh, a->fch, dh, (size_t)at->B * at->T * H);
    ops->linear.backward(ops->linear.ctx, at, LINEAR_FC, dinp, g->fcw, g->fcb, dh, inp, w->fcw, C, H);
}

static inline GPT2Ops gpt2_default_ops(void) {
    GPT2Ops o;
    memset(&o, 0, sizeof(o));
    o.embedding.forward = op_embedding_forward;
    o.embedding.backward = op_embedding_backward;
    o.linear.forward = op_linear_forward;
    o.linear.backward = op_linear_backward;
    o.attention.forward = op_attention_forward;
    o.attention.backward = op_attention_backward;
    o.mlp.forward = op_mlp_forward;
    o.mlp.backward = op_mlp_backward;
    o.classifier.loss = op_classifier;
    o.classifier.row_to_host = op_logits_row_to_host;
    return o;
}

// ---------------------------------------------------------------------------------------
// Building

// Local sizes of this rank's shard of a block
static inline int gpt2_local_heads(const GPT2* m) { return m->config.num_heads / m->place.tp; }
static inline int gpt2_local_qkv(const GPT2* m) { return 3 * m->config.channels / m->place.tp; }
static inline int gpt2_local_attn(const GPT2* m) { return m->config.channels / m->place.tp; }
static inline int gpt2_local_hidden(const GPT2* m) { return 4 * m->config.channels / m->place.tp; }
static inline int gpt2_local_vocab(const GPT2* m) { return tp_vocab_rows(m->config.padded_vocab_size, m->place.tp); }
// The run's padded vocabulary: the width of a whole row of logits, tp x the local vocabulary.
// It is Vp, except where tp does not divide Vp: then the shards pad it further (llmc/model/params.h:
// tp_vocab_rows), and checkpoints still hold Vp rows.
static inline int gpt2_run_vocab(const GPT2* m) { return tp_padded_vocab(m->config.padded_vocab_size, m->place.tp); }
static inline int gpt2_local_layers(const GPT2* m) { return gpt2_place_num_layers(&m->place); }
// layers one activation slot holds: one chunk's (all the stage's without interleaving)
static inline int gpt2_slot_layers(const GPT2* m) { return gpt2_place_chunk_layers(&m->place); }

// Sane limits on a shape, far above every GPT-2 and today's largest models (GPT-3 175B: 96 layers,
// 12288 channels; DeepSeek-V3: 256 routed experts), below where a count would overflow or a
// table of layers or experts could not be built. "" when the shape is within them. A checkpoint's
// header is held to them too (llmc/model/checkpoint.h).
static inline std::string gpt2_shape_beyond_limits(const GPT2Config* c) {
    struct { const char* name; int value, most; } limits[] = {
        {"layers", c->num_layers, 1024}, {"heads", c->num_heads, 1024}, {"channels", c->channels, 65536},
        {"max-seq", c->max_seq_len, 1 << 20}, {"padded vocab", c->padded_vocab_size, 1 << 17}, {"experts", c->num_experts, 1024}};
    for (auto& l : limits) {
        if (l.value > l.most) { return std::string(l.name) + " " + std::to_string(l.value) + " is more than " + std::to_string(l.most) + ", the most this code builds"; }
    }
    return "";
}

static inline void gpt2_check_config(const GPT2Config* cfg) {
    if (cfg->num_layers <= 0 || cfg->num_heads <= 0 || cfg->channels <= 0 || cfg->max_seq_len <= 0 ||
        cfg->vocab_size <= 0) {
        die("model sizes must be positive (layers %d, heads %d, channels %d, max-seq %d, vocab %d)",
            cfg->num_layers, cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size);
    }
    if (cfg->channels % cfg->num_heads != 0) {
        die("channels (%d) must be divisible by heads (%d)", cfg->channels, cfg->num_heads);
    }
    if (cfg->padded_vocab_size < cfg->vocab_size) {
        die("padded vocab %d is smaller than vocab %d", cfg->padded_vocab_size, cfg->vocab_size);
    }
    if (cfg->vocab_size > 65536) { die("vocab %d does not fit the uint16 token shards", cfg->vocab_size); }
    std::string far = gpt2_shape_beyond_limits(cfg);
    if (!far.empty()) { die("model shape: %s", far.c_str()); }
    gpt2_check_moe(cfg);
}

// The model's shape as a rank at `place` holds it, no memory yet: the config, the place, the
// parameter tables, the ops (and the MoE's routing state). The planner (llmc/planner/search.h)
// stops here and asks the formulas; gpt2_build_shard goes on to allocate.
static inline void gpt2_shape_shard(GPT2* model, const GPT2Config* cfg, const GPT2Place* place) {
    memset(model, 0, sizeof(*model));
    gpt2_check_config(cfg);
    gpt2_place_check(place, cfg);
    model->config = *cfg;
    model->place = *place;
    GPT2Place whole = gpt2_place_whole(cfg);
    fill_param_table(model->full_info, cfg, &whole);
    fill_param_table(model->param_info, cfg, place);
    model->num_parameters_full = param_table_total(model->full_info);
    model->num_parameters = param_table_total(model->param_info);
    model->ops = gpt2_default_ops();
    if (gpt2_is_moe(cfg)) { model->moe = moe_create(cfg, place); }
}

// The model as a rank at `place` holds it (gpt2_build: the whole model).
// Memory a shape cannot have is refused before it is asked for, naming what needs it: a model or
// batch far beyond the machine would otherwise fail deep inside an allocation, or (Linux
// overcommits) be killed later when its pages are touched. This rank's parameters with their
// gradients, AdamW moments and master copy; then (gpt2_activations_slots) with the activations.
static inline double gpt2_state_bytes(const GPT2* model) {
    double n = (double)model->num_parameters;
    return n * (2.0 * sizeof(floatX) + 2.0 * sizeof(float) + (sizeof(floatX) < sizeof(float) ? sizeof(float) : 0));
}
static inline void gpt2_check_fits(const char* what, double bytes) {
    double have = (double)device_memory_total();
    if (bytes > have) {
        die("%s need %.1f GiB, more than the %.1f GiB of memory there is (a smaller model, --batch or --seq, or more "
            "ranks to share it)", what, bytes / 1073741824.0, have / 1073741824.0);
    }
}

static inline void gpt2_build_shard(GPT2* model, const GPT2Config* cfg, const GPT2Place* place) {
    gpt2_shape_shard(model, cfg, place);
    char what[128];
    snprintf(what, sizeof(what), "the %zu parameters of this rank with their gradients and AdamW state", model->num_parameters);
    gpt2_check_fits(what, gpt2_state_bytes(model));
    size_t bytes = model->num_parameters * sizeof(floatX);
    model->params_memory = (floatX*)device_malloc(bytes);
    model->grads_memory = (floatX*)device_malloc(bytes);
    device_memset_zero(model->grads_memory, bytes);
    point_parameters(&model->params, model->params_memory, model->param_info);
    point_parameters(&model->grads, model->grads_memory, model->param_info);
    model->norm_squared = (float*)device_malloc(sizeof(float));
    model->loss_scale = 1.0f;
}
static inline void gpt2_build(GPT2* model, const GPT2Config* cfg) {
    GPT2Place whole = gpt2_place_whole(cfg);
    gpt2_build_shard(model, cfg, &whole);
}

// Set this rank's parameters from the FULL model in host memory (table order, fp32).
static inline void gpt2_set_parameters_from_full(GPT2* model, float* full) {
    if (gpt2_place_is_whole(&model->place, &model->config)) {
        copy_floats_to_device(model->params_memory, full, model->num_parameters);
        return;
    }
    float* local = (float*)malloc(model->num_parameters * sizeof(float));
    if (local == NULL) { die("out of host memory for %zu parameters", model->num_parameters); }
    param_slice(model->full_info, model->param_info, &model->place, full, local, 1);
    copy_floats_to_device(model->params_memory, local, model->num_parameters);
    free(local);
}

// GPT-2 initialisation, drawn on the host for the FULL tensor in table order (so a sharded
// run draws the same numbers and keeps its slice), then copied to the device.
static inline void gpt2_init_random(GPT2* model, uint64_t seed) {
    Rng rng;
    rng_init(&rng, seed);
    float* host = (float*)malloc(model->num_parameters_full * sizeof(float));
    if (host == NULL) { die("out of host memory for %zu parameters", model->num_parameters_full); }
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->full_info[i];
        float* dst = host + p->offset;
        size_t n = p->numel;
        if (strcmp(p->name, "wte") == 0) {
            // the padded vocabulary rows stay zero: no token ever selects them
            n = (size_t)model->config.vocab_size * model->config.channels;
            memset(dst + n, 0, (p->numel - n) * sizeof(float));
        }
        if (p->init == INIT_NORMAL) { rng_normal(&rng, dst, n, 0.0f, p->init_std); }
        else { for (size_t j = 0; j < n; j++) { dst[j] = p->init == INIT_ONES ? 1.0f : 0.0f; } }
    }
    gpt2_set_parameters_from_full(model, host);
    free(host);
}

// The floats the attention op saves per layer for its backward (its own count, or the kernel's)
static inline size_t gpt2_attention_state_size(const GPT2* model, int B, int T) {
    const GPT2Ops* o = &model->ops;
    int NH = gpt2_local_heads(model);
    if (o->attention.state_size) { return o->attention.state_size(o->attention.ctx, B, T, (int)gpt2_local_attn(model), NH); }
    return attention_state_size(B, T, NH);
}

// Activations for `slots` micro-batches of up to B x T tokens each (T <= max_seq_len). With
// dry = 1 nothing is allocated: only acts_bytes and acts_requested are set, the figures the
// memory tables print (the planner's dry model, llmc/planner/search.h).
static inline void gpt2_activations_slots(GPT2* model, int B, int T, int slots, int dry) {
    const GPT2Config* c = &model->config;
    if (T > c->max_seq_len) { die("sequence length %d exceeds the model's maximum %d", T, c->max_seq_len); }
    if (B <= 0 || T <= 0) { die("batch (%d) and sequence length (%d) must be positive", B, T); }
    if (slots < 1 || slots > GPT2_MAX_SLOTS) { die("%d activation slots: 1 to %d", slots, GPT2_MAX_SLOTS); }
    if (model->place.sp && T % model->place.tp != 0) {
        die("sequence parallelism: the sequence length %d is not divisible by tp %d", T, model->place.tp);
    }
    size_t L = gpt2_slot_layers(model), C = c->channels, BT = (size_t)B * T, Vp = gpt2_local_vocab(model);
    size_t logits = model->place.has_head ? BT * Vp : 0;   // only the stage with the head has logits
    size_t BTs = (size_t)B * gpt2_place_stream_tokens(&model->place, T);   // the residual stream's tokens
    size_t Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model);
    size_t att = gpt2_attention_state_size(model, B, T);
    // what each slot keeps per layer (--recompute): Lk layers of most buffers (none with full
    // recomputation), La of the attention state and the GELU output (none with selective or
    // full); residual3 always, as the next layer's input. The rest: one block's scratch set.
    int mode = model->recompute;
    size_t Lk = mode == RECOMPUTE_FULL ? 0 : L, La = mode == RECOMPUTE_NONE ? L : 0;
    size_t Sk = mode == RECOMPUTE_FULL ? 1 : 0, Sa = mode == RECOMPUTE_NONE ? 0 : 1;   // scratch: 1 or 0 layers
    // (pointer, element count, element size) for every buffer, carved from one allocation
    struct Buf { void** ptr; size_t count; size_t elsize; };
    std::vector<Buf> tensors;
    for (int s = 0; s < slots; s++) {
        ActivationTensors* a = &model->acts[s];
        Buf per_slot[] = {
            {(void**)&a->encoded, BTs * C, sizeof(floatX)},
            {(void**)&a->ln1, Lk * BTs * C, sizeof(floatX)},
            {(void**)&a->ln1_mean, Lk * BTs, sizeof(float)},
            {(void**)&a->ln1_rstd, Lk * BTs, sizeof(float)},
            {(void**)&a->qkv, Lk * BT * Cq, sizeof(floatX)},
            {(void**)&a->atty, Lk * BT * Ca, sizeof(floatX)},
            {(void**)&a->att, La * att, sizeof(float)},
            {(void**)&a->attproj, Lk * BTs * C, sizeof(floatX)},
            {(void**)&a->residual2, Lk * BTs * C, sizeof(floatX)},
            {(void**)&a->ln2, Lk * BTs * C, sizeof(floatX)},
            {(void**)&a->ln2_mean, Lk * BTs, sizeof(float)},
            {(void**)&a->ln2_rstd, Lk * BTs, sizeof(float)},
            {(void**)&a->fch, Lk * BT * H, sizeof(floatX)},
            {(void**)&a->fch_gelu, La * BT * H, sizeof(floatX)},
            {(void**)&a->fcproj, Lk * BTs * C, sizeof(floatX)},
            {(void**)&a->residual3, L * BTs * C, sizeof(floatX)},
            {(void**)&a->lnf, BTs * C, sizeof(floatX)},
            {(void**)&a->lnf_mean, BTs, sizeof(float)},
            {(void**)&a->lnf_rstd, BTs, sizeof(float)},
            {(void**)&a->logits, logits, sizeof(floatX)},
        };
        tensors.insert(tensors.end(), per_slot, per_slot + sizeof(per_slot) / sizeof(per_slot[0]));
    }
    Buf shared[] = {
        {(void**)&model->bufs.dresidual, BTs * C, sizeof(floatX)},
        {(void**)&model->bufs.dln, BTs * C, sizeof(floatX)},
        {(void**)&model->bufs.datty, BT * Ca, sizeof(floatX)},
        {(void**)&model->bufs.dqkv, BT * Cq, sizeof(floatX)},
        {(void**)&model->bufs.dfch, BT * H, sizeof(floatX)},
    };
    tensors.insert(tensors.end(), shared, shared + sizeof(shared) / sizeof(shared[0]));
    BlockActs* r = &model->scratch;   // recomputation's one block (its input and residual3 are kept)
    memset(r, 0, sizeof(*r));
    Buf scratch[] = {
        {(void**)&r->ln1, Sk * BTs * C, sizeof(floatX)},
        {(void**)&r->ln1_mean, Sk * BTs, sizeof(float)},
        {(void**)&r->ln1_rstd, Sk * BTs, sizeof(float)},
        {(void**)&r->qkv, Sk * BT * Cq, sizeof(floatX)},
        {(void**)&r->atty, Sk * BT * Ca, sizeof(floatX)},
        {(void**)&r->att, Sa * att, sizeof(float)},
        {(void**)&r->attproj, Sk * BTs * C, sizeof(floatX)},
        {(void**)&r->residual2, Sk * BTs * C, sizeof(floatX)},
        {(void**)&r->ln2, Sk * BTs * C, sizeof(floatX)},
        {(void**)&r->ln2_mean, Sk * BTs, sizeof(float)},
        {(void**)&r->ln2_rstd, Sk * BTs, sizeof(float)},
        {(void**)&r->fch, Sk * BT * H, sizeof(floatX)},
        {(void**)&r->fch_gelu, Sa * BT * H, sizeof(floatX)},
        {(void**)&r->fcproj, Sk * BTs * C, sizeof(floatX)},
    };
    tensors.insert(tensors.end(), scratch, scratch + sizeof(scratch) / sizeof(scratch[0]));
    for (int s = 0; s < slots; s++) {
        ActivationTensors* a = &model->acts[s];
        Buf io[] = {
            {(void**)&a->losses, BT, sizeof(float)},
            {(void**)&a->inputs, BT, sizeof(int)},
            {(void**)&a->targets, BT, sizeof(int)},
            {(void**)&a->loss_weights, BT, sizeof(float)},
        };
        tensors.insert(tensors.end(), io, io + sizeof(io) / sizeof(io[0]));
    }
    size_t total = 0, requested = 0;
    for (const Buf& t : tensors) { total += ceil_div(t.count * t.elsize, 64) * 64; requested += t.count * t.elsize; }
    if (dry) {
        model->acts_bytes = total;
        model->acts_requested = requested;
        model->max_B = B;
        model->max_T = T;
        model->num_slots = slots;
        return;
    }
    if (model->acts_memory) { device_free(model->acts_memory); free(model->losses_host); }
    char what[160];
    snprintf(what, sizeof(what), "the activations of %d x %d tokens (%d slot%s) with the %zu parameters' state", B, T, slots,
             slots > 1 ? "s" : "", model->num_parameters);
    gpt2_check_fits(what, (double)total + gpt2_state_bytes(model));
    model->acts_memory = device_malloc(total);
    model->acts_bytes = total;
    model->acts_requested = requested;
    char* base = (char*)model->acts_memory;
    for (const Buf& t : tensors) {
        *t.ptr = t.count ? base : NULL;   // a buffer this mode does not keep is NULL: misuse fails loudly
        base += ceil_div(t.count * t.elsize, 64) * 64;   // keep 64-byte alignment
    }
    for (int s = 0; s < slots; s++) {
        if (!model->place.has_head) { model->acts[s].logits = NULL; }
    }
    model->logits = model->acts[0].logits;
    model->losses_host = (float*)malloc(BT * sizeof(float));
    model->max_B = B;
    model->max_T = T;
    model->num_slots = slots;
    // the MoE blocks' routing and expert activations: their own buffers (llmc/model/moe.h), sized by capacity
    if (model->moe) { moe_allocate(model->moe, c, &model->place, B, T, slots, (int)H); }
}
static inline void gpt2_allocate_activations_slots(GPT2* model, int B, int T, int slots) {
    gpt2_activations_slots(model, B, T, slots, 0);
}
static inline void gpt2_allocate_activations(GPT2* model, int B, int T) { gpt2_allocate_activations_slots(model, B, T, 1); }

// The activation bytes of `slots` slots of B x T tokens in closed form: the count in the lecture
// "Data Parallelism in LLM Training" (from Korthikanti et al. 2022: 34 sbh + 5 a s^2 b bytes per
// layer at 2 bytes a value) written
// for this code, with v bytes a value (sizeof(floatX): 4 on the CPU, 2 for CUDA's bf16), h = C,
// Ts the residual stream's tokens (T, or T/tp with SP), and S_att the attention op's state
// floats per layer (CPU: B NH/tp T^2, the probabilities; CUDA: B NH/tp T, the log-sum-exps):
//   one whole block  B Ts (6 v h + 16) + B T 12 v h/tp + 4 S_att
//     stream (6 h): ln1, attproj, residual2, ln2, fcproj, residual3; 16: 4 fp32 layernorm statistics
//     tp region (12 h/tp): qkv 3, atty 1, fch 4, fch_gelu 4
//   per layer kept   none: the whole block; selective: minus fch_gelu and the state,
//                    B T 4 v h/tp + 4 S_att; full: residual3 only, B Ts v h
//   scratch (once)   none: 0; selective: B T 4 v h/tp + 4 S_att; full: the whole block minus
//                    residual3 (the block's input and output are kept)
//   per slot         Ls layers kept + encoded, lnf + stats B Ts (2 v h + 8) + logits B T Vs v
//                    (the stage with the head) + losses, tokens, targets, weights 16 B T
//   backward         dresidual, dln B Ts 2 v h + datty, dqkv, dfch B T 8 v h/tp (one layer's)
typedef struct {
    size_t block, per_layer, scratch, per_slot, backward, total;
} ActivationFormula;

static inline ActivationFormula gpt2_activation_formula(const GPT2* m, int B, int T, int slots) {
    const GPT2Config* c = &m->config;
    size_t v = sizeof(floatX), h = (size_t)c->channels, tp = (size_t)m->place.tp, Ls = (size_t)gpt2_slot_layers(m);
    size_t b = (size_t)B, s = (size_t)T, Ts = (size_t)gpt2_place_stream_tokens(&m->place, T);
    size_t S = gpt2_attention_state_size(m, B, T);   // the attention op's own count (state_size)
    ActivationFormula f;
    f.block = b * Ts * (6 * v * h + 16) + b * s * 12 * v * h / tp + 4 * S;
    size_t again = b * s * 4 * v * h / tp + 4 * S;   // selective: fch_gelu and the attention state
    switch (m->recompute) {
        case RECOMPUTE_SELECTIVE: f.per_layer = f.block - again; f.scratch = again; break;
        case RECOMPUTE_FULL: f.per_layer = b * Ts * v * h; f.scratch = f.block - b * Ts * v * h; break;
        default: f.per_layer = f.block; f.scratch = 0; break;
    }
    f.per_slot = Ls * f.per_layer + b * Ts * (2 * v * h + 8) +
                 (m->place.has_head ? b * s * (size_t)gpt2_local_vocab(m) * v : 0) + 16 * b * s;
    f.backward = b * Ts * 2 * v * h + b * s * 8 * v * h / tp;
    f.total = (size_t)slots * f.per_slot + f.scratch + f.backward;
    return f;
}

// ---------------------------------------------------------------------------------------
// Forward pieces

// A micro-batch's tokens (host array, B x T) into a slot.
static inline void gpt2_set_batch(GPT2* model, int slot, const int* inputs, int B, int T) {
    if (slot < 0 || slot >= model->num_slots) { die("activation slot %d of %d", slot, model->num_slots); }
    if (B > model->max_B || T > model->max_T) {
        die("batch %dx%d is larger than the %dx%d the activations were allocated for", B, T, model->max_B, model->max_T);
    }
    if (model->place.sp && T % model->place.tp != 0) {
        die("sequence parallelism: a batch of sequence length %d does not split over tp %d", T, model->place.tp);
    }
    ActivationTensors* a = &model->acts[slot];
    a->B = B;
    a->T = T;
    a->chunk = 0;
    a->Ts = gpt2_place_stream_tokens(&model->place, T);
    if (inputs) { copy_host_to_device(a->inputs, inputs, (size_t)B * T * sizeof(int)); }
}

// The root tensors (embedding, head) for this micro-batch's forward: the hooks may move them.
static inline void gpt2_forward_begin(GPT2* model) {
    model->root = model->params;
    hooks_forward_begin(&model->hooks, &model->root);
}

static inline OpAt gpt2_at(GPT2* model, int slot, int layer) {
    const ActivationTensors* a = &model->acts[slot];
    OpAt at = {model, slot, layer, a->B, a->T, a->Ts};
    return at;
}

static inline void gpt2_embed_forward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    OpAt at = gpt2_at(model, slot, -1);
    model->ops.embedding.forward(model->ops.embedding.ctx, &at, a->encoded, a->inputs, model->positions, model->root.wte,
                                 model->root.wpe, model->config.channels);
}

// Block l's saved activations in a slot (l: global layer index; li: its index in the slot,
// whose layers are one chunk's). What recomputation does not keep per layer points into the
// one scratch block (model->scratch): the forward writes it there, the backward rebuilds it.
static inline BlockActs gpt2_block_acts(GPT2* model, int slot, int l) {
    ActivationTensors* a = &model->acts[slot];
    size_t BT = (size_t)a->B * a->T, BTs = (size_t)a->B * a->Ts, C = model->config.channels;
    int local = gpt2_place_local(&model->place, l);
    if (local < 0 || local / gpt2_slot_layers(model) != a->chunk) {
        die("block %d is not in chunk %d of this pipeline stage", l, a->chunk);
    }
    size_t li = (size_t)(local % gpt2_slot_layers(model));
    size_t Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model);
    size_t att = gpt2_attention_state_size(model, a->B, a->T);
    BlockActs b;
    if (model->recompute == RECOMPUTE_FULL) {
        b = model->scratch;   // everything but the block's input and output
    } else {
        b.ln1 = a->ln1 + li * BTs * C;
        b.ln1_mean = a->ln1_mean + li * BTs;
        b.ln1_rstd = a->ln1_rstd + li * BTs;
        b.qkv = a->qkv + li * BT * Cq;
        b.atty = a->atty + li * BT * Ca;
        b.attproj = a->attproj + li * BTs * C;
        b.residual2 = a->residual2 + li * BTs * C;
        b.ln2 = a->ln2 + li * BTs * C;
        b.ln2_mean = a->ln2_mean + li * BTs;
        b.ln2_rstd = a->ln2_rstd + li * BTs;
        b.fch = a->fch + li * BT * H;
        b.fcproj = a->fcproj + li * BTs * C;
        if (model->recompute == RECOMPUTE_SELECTIVE) {
            b.att = model->scratch.att;
            b.fch_gelu = model->scratch.fch_gelu;
        } else {
            b.att = a->att + li * att;
            b.fch_gelu = a->fch_gelu + li * BT * H;
        }
    }
    b.residual = li == 0 ? a->encoded : a->residual3 + (li - 1) * BTs * C;
    b.residual3 = a->residual3 + li * BTs * C;
    return b;
}
// the output of the slot's last block (what the head, or the next stage, reads)
static inline floatX* gpt2_stage_output(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    return a->residual3 + (size_t)(gpt2_slot_layers(model) - 1) * a->B * a->Ts * model->config.channels;
}

// The block's computation on given weights and activation buffers: the one copy of the block
// that training (gpt2_block_forward), generation (llmc/model/generate.h) and full recomputation
// (gpt2_block_recompute) share. In two pieces: up to ln2 (the attention half), then the MLP.
static inline void gpt2_block_compute_attention(GPT2* model, const GPT2Ops* ops, const OpAt* at, const BlockWeights* w,
                                                BlockActs* b) {
    int B = at->B, Ts = at->Ts, C = model->config.channels;   // the residual stream: B x Ts tokens
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), NH = gpt2_local_heads(model);
    layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, b->residual, w->ln1w, w->ln1b, B, Ts, C);
    ops->linear.forward(ops->linear.ctx, at, LINEAR_QKV, b->qkv, b->ln1, w->qkvw, w->qkvb, C, Cq);
    ops->attention.forward(ops->attention.ctx, at, b->atty, b->att, b->qkv, Ca, NH);
    ops->linear.forward(ops->linear.ctx, at, LINEAR_ATTPROJ, b->attproj, b->atty, w->attprojw, w->attprojb, Ca, C);
    residual_forward(b->residual2, b->residual, b->attproj, (size_t)B * Ts * C);
    layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->residual2, w->ln2w, w->ln2b, B, Ts, C);
}
static inline void gpt2_block_compute(GPT2* model, const GPT2Ops* ops, const OpAt* at, const BlockWeights* w,
                                      BlockActs* b) {
    int C = model->config.channels, H = gpt2_local_hidden(model);
    gpt2_block_compute_attention(model, ops, at, w, b);
    MLPActs mlp = {b->fch, b->fch_gelu, b->fcproj};
    ops->mlp.forward(ops->mlp.ctx, at, &mlp, b->ln2, w, C, H);
    residual_forward(b->residual3, b->residual2, b->fcproj, (size_t)at->B * at->Ts * C);
}

// Recomputation (--recompute), at the start of block l's backward: rebuild in the scratch block
// what the forward did not keep, from what it kept, with the same kernels and ops on the same
// inputs (so the same bits), and the weights the backward's hooks provide (ZeRO-3 gathers them).
//   selective  the attention op again on the kept qkv: its state into the scratch, its output
//              (= the kept atty) into datty, free until the attention projection's backward
//              writes it; the GELU again on the kept fch
//   full       the block's forward from its kept input, without the last residual add (residual3
//              is kept: the next layer's input). An MoE block's MLP is not rerun: its routing
//              and expert activations live in the MoE's own per-slot buffers (llmc/model/moe.h), and
//              a second routing would count the step's statistics (and the all-to-alls) twice;
//              its backward needs only ln2, which the attention half rebuilds.
static inline void gpt2_block_rebuild(GPT2* model, const OpAt* at, const BlockWeights* w, BlockActs* b) {
    const GPT2Ops* ops = &model->ops;
    int C = model->config.channels, H = gpt2_local_hidden(model);
    int dense = !gpt2_layer_is_moe(&model->config, at->layer);
    if (model->recompute == RECOMPUTE_FULL) {
        gpt2_block_compute_attention(model, ops, at, w, b);
        if (dense) {
            MLPActs mlp = {b->fch, b->fch_gelu, b->fcproj};
            ops->mlp.forward(ops->mlp.ctx, at, &mlp, b->ln2, w, C, H);
        }
        return;
    }
    ops->attention.forward(ops->attention.ctx, at, model->bufs.datty, b->att, b->qkv, gpt2_local_attn(model),
                           gpt2_local_heads(model));
    if (dense) { gelu_forward(b->fch_gelu, b->fch, (size_t)at->B * at->T * H); }
}
// While it runs, model->recomputing tells ops that keep state across calls to replay what the
// forward did rather than record again (llmc/model/fp8.h: the forward's scales, no second amax), and
// --precision's counters pause (each stored value counted once).
static inline void gpt2_block_recompute(GPT2* model, const OpAt* at, const BlockWeights* w, BlockActs* b) {
    if (model->recompute == RECOMPUTE_NONE) { return; }
    model->recomputing = 1;
    backend_precision_counting(0);
    gpt2_block_rebuild(model, at, w, b);
    backend_precision_counting(1);
    model->recomputing = 0;
}

static inline void gpt2_block_forward(GPT2* model, int slot, int l) {
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    hooks_block_forward_begin(&model->hooks, l, &w);
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    gpt2_block_compute(model, &model->ops, &at, &w, &b);
    hooks_block_forward_end(&model->hooks, l);
}

// final layernorm and the tied LM head: logits (B, T, Vp) of the slot
static inline void gpt2_head_forward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    OpAt at = gpt2_at(model, slot, -1);
    int C = model->config.channels;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, gpt2_stage_output(model, slot), model->root.lnfw,
                      model->root.lnfb, a->B, a->Ts, C);
    model->ops.linear.forward(model->ops.linear.ctx, &at, LINEAR_LM_HEAD, a->logits, a->lnf, model->root.wte, NULL, C,
                              gpt2_local_vocab(model));
}

// Cross-entropy on the slot's logits. targets (and optional per-token weights) are host arrays
// of B x T. Returns the sum over tokens of w_i * CE_i; the caller divides by the number of
// tokens it averages over. With write_dlogits the logits are overwritten by the logit
// gradients (scaled by dloss) for the backward.
static inline float gpt2_head_loss(GPT2* model, int slot, const int* targets, const float* weights, float dloss,
                                   int write_dlogits) {
    ActivationTensors* a = &model->acts[slot];
    int BT = a->B * a->T;
    OpAt at = gpt2_at(model, slot, -1);
    copy_host_to_device(a->targets, targets, (size_t)BT * sizeof(int));
    if (weights) { copy_host_to_device(a->loss_weights, weights, (size_t)BT * sizeof(float)); }
    model->ops.classifier.loss(model->ops.classifier.ctx, &at, a->logits, a->losses, weights ? a->loss_weights : NULL, a->targets,
                          dloss, model->config.vocab_size, gpt2_run_vocab(model), write_dlogits);
    copy_device_to_host(model->losses_host, a->losses, (size_t)BT * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += model->losses_host[i]; }
    return (float)sum;
}

// ---------------------------------------------------------------------------------------
// Backward pieces: from the dlogits left by gpt2_head_loss to parameter gradients, which are
// ACCUMULATED (+=) so that several micro-steps add up before one update.
// The residual add's gradient is the identity into both of its inputs, so one buffer,
// dresidual, carries the residual stream's gradient down through all the layers; each
// branch reads it and each layernorm backward adds its input gradient into it.

static inline void gpt2_backward_begin(GPT2* model) {
    model->root_in_pass = 0;
    model->root = model->params;
    model->root_grads = model->grads;
    hooks_backward_begin(&model->hooks, &model->root, &model->root_grads);
}

// LM head and final layernorm: dresidual = d(stage output)
static inline void gpt2_head_backward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    GradientBuffers d = model->bufs;
    OpAt at = gpt2_at(model, slot, -1);
    int B = a->B, Ts = a->Ts, C = model->config.channels;
    model->root_in_pass = 1;
    model->ops.linear.backward(model->ops.linear.ctx, &at, LINEAR_LM_HEAD, d.dln, model->root_grads.wte, NULL, a->logits,
                               a->lnf, model->root.wte, C, gpt2_local_vocab(model));
    device_memset_zero(d.dresidual, (size_t)B * Ts * C * sizeof(floatX));
    layernorm_backward(d.dresidual, model->root_grads.lnfw, model->root_grads.lnfb, d.dln, gpt2_stage_output(model, slot),
                       model->root.lnfw, a->lnf_mean, a->lnf_rstd, B, Ts, C);
}

// dresidual holds d(block l's output) on entry, d(block l's input) on exit
static inline void gpt2_block_backward(GPT2* model, int slot, int l) {
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    BlockWeights gw = block_weights_in(model->grads_memory, model->param_info, &model->place, l);
    hooks_block_backward_begin(&model->hooks, l, &w, &gw);
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    gpt2_block_recompute(model, &at, &w, &b);   // --recompute: what the forward did not keep
    const GPT2Ops* ops = &model->ops;
    GradientBuffers d = model->bufs;
    int B = at.B, Ts = at.Ts, C = model->config.channels;   // layernorms: the residual stream's B x Ts tokens
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model), NH = gpt2_local_heads(model);
    // MLP half: dresidual holds d(residual3) = d(fcproj) = d(residual2) so far
    MLPActs mlp = {b.fch, b.fch_gelu, b.fcproj};
    ops->mlp.backward(ops->mlp.ctx, &at, d.dln, d.dresidual, &mlp, b.ln2, &w, &gw, d.dfch, C, H);
    layernorm_backward(d.dresidual, gw.ln2w, gw.ln2b, d.dln, b.residual2, w.ln2w, b.ln2_mean, b.ln2_rstd, B, Ts, C);
    // attention half: dresidual now holds d(residual2) = d(attproj) = d(residual)
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_ATTPROJ, d.datty, gw.attprojw, gw.attprojb, d.dresidual, b.atty,
                         w.attprojw, Ca, C);
    ops->attention.backward(ops->attention.ctx, &at, d.dqkv, d.datty, b.qkv, b.att, Ca, NH);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_QKV, d.dln, gw.qkvw, gw.qkvb, d.dqkv, b.ln1, w.qkvw, C, Cq);
    layernorm_backward(d.dresidual, gw.ln1w, gw.ln1b, d.dln, b.residual, w.ln1w, b.ln1_mean, b.ln1_rstd, B, Ts, C);
    hooks_block_backward_end(&model->hooks, l);
}

// The same backward cut in two, for zero-bubble pipeline schedules (llmc/parallel/pp.h, ZB-H1):
//   B (gpt2_block_backward_input)   the input gradients only: what the previous stage waits for.
//                                    Every linear and layernorm runs with its weight-gradient half
//                                    switched off (NULL), and keeps its output gradient in `keep`.
//   W (gpt2_block_backward_weight)  the weight gradients, later, from what B kept:
//                                    dW += dY^T X for each linear, the layernorms' dgamma, dbeta.
// B + W compute exactly what gpt2_block_backward computes (the same kernels, the same sums).
// `keep` holds per layer: d(residual3) and d(residual2) (B x Ts x C), d(fch) (B x T x H),
// d(qkv) (B x T x Cq), d(ln2 out) and d(ln1 out) (B x Ts x C): gpt2_keep_floats says how many.
typedef struct { floatX *dres3, *dfch, *dln2, *dres2, *dqkv, *dln1; } BlockGradKeep;

static inline size_t gpt2_keep_floats(const GPT2* m, int B, int T) {
    size_t BT = (size_t)B * T, BTs = (size_t)B * gpt2_place_stream_tokens(&m->place, T), C = m->config.channels;
    return 4 * BTs * C + BT * gpt2_local_hidden(m) + BT * gpt2_local_qkv(m);
}
static inline BlockGradKeep gpt2_keep_at(const GPT2* m, floatX* base, int B, int T) {
    size_t BT = (size_t)B * T, BTs = (size_t)B * gpt2_place_stream_tokens(&m->place, T), C = m->config.channels;
    BlockGradKeep k;
    k.dres3 = base;
    k.dres2 = k.dres3 + BTs * C;
    k.dln2 = k.dres2 + BTs * C;
    k.dln1 = k.dln2 + BTs * C;
    k.dfch = k.dln1 + BTs * C;
    k.dqkv = k.dfch + BT * gpt2_local_hidden(m);
    return k;
}

// B needs the block's weights but no gradient buffer: it raises no placement hook (ZeRO-3, which
// gathers weights in them, does not combine with it). W raises the block's backward hooks, so
// data parallelism's buckets receive the weight gradients and see the block complete after W.
// Recomputation does not combine with it either: W reads the activations long after B, with other
// micro-batches' B passes in between, so one recomputed scratch block cannot serve both.
static inline void gpt2_block_backward_input(GPT2* model, int slot, int l, const BlockGradKeep* k) {
    if (model->params_memory == NULL) { die("the zero-bubble backward needs this rank's weights in place (not ZeRO-3)"); }
    if (model->recompute != RECOMPUTE_NONE) {
        die("--recompute %s does not combine with --pp-schedule zb-h1: its split backward reads the activations twice, "
            "apart", gpt2_recompute_name(model->recompute));
    }
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    BlockWeights gw;
    memset(&gw, 0, sizeof(gw));   // no weight gradients in this half
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    const GPT2Ops* ops = &model->ops;
    GradientBuffers d = model->bufs;
    int B = at.B, Ts = at.Ts, C = model->config.channels;
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model), NH = gpt2_local_heads(model);
    size_t BTsC = (size_t)B * Ts * C;
    copy_device_to_device(k->dres3, d.dresidual, BTsC * sizeof(floatX));   // fcproj's dY
    MLPActs mlp = {b.fch, b.fch_gelu, b.fcproj};
    ops->mlp.backward(ops->mlp.ctx, &at, k->dln2, d.dresidual, &mlp, b.ln2, &w, &gw, k->dfch, C, H);   // dfch: fc's dY
    layernorm_backward(d.dresidual, NULL, NULL, k->dln2, b.residual2, w.ln2w, b.ln2_mean, b.ln2_rstd, B, Ts, C);
    copy_device_to_device(k->dres2, d.dresidual, BTsC * sizeof(floatX));   // attproj's dY
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_ATTPROJ, d.datty, NULL, NULL, d.dresidual, b.atty, w.attprojw, Ca, C);
    ops->attention.backward(ops->attention.ctx, &at, k->dqkv, d.datty, b.qkv, b.att, Ca, NH);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_QKV, k->dln1, NULL, NULL, k->dqkv, b.ln1, w.qkvw, C, Cq);
    layernorm_backward(d.dresidual, NULL, NULL, k->dln1, b.residual, w.ln1w, b.ln1_mean, b.ln1_rstd, B, Ts, C);
}

static inline void gpt2_block_backward_weight(GPT2* model, int slot, int l, const BlockGradKeep* k) {
    if (model->recompute != RECOMPUTE_NONE) { die("--recompute %s does not combine with --pp-schedule zb-h1", gpt2_recompute_name(model->recompute)); }
    BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
    BlockWeights gw = block_weights_in(model->grads_memory, model->param_info, &model->place, l);
    hooks_block_backward_begin(&model->hooks, l, &w, &gw);
    BlockActs b = gpt2_block_acts(model, slot, l);
    OpAt at = gpt2_at(model, slot, l);
    const GPT2Ops* ops = &model->ops;
    int B = at.B, Ts = at.Ts, C = model->config.channels;
    int Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_FCPROJ, NULL, gw.fcprojw, gw.fcprojb, k->dres3, b.fch_gelu, w.fcprojw, H, C);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_FC, NULL, gw.fcw, gw.fcb, k->dfch, b.ln2, w.fcw, C, H);
    layernorm_backward(NULL, gw.ln2w, gw.ln2b, k->dln2, b.residual2, w.ln2w, b.ln2_mean, b.ln2_rstd, B, Ts, C);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_ATTPROJ, NULL, gw.attprojw, gw.attprojb, k->dres2, b.atty, w.attprojw, Ca, C);
    ops->linear.backward(ops->linear.ctx, &at, LINEAR_QKV, NULL, gw.qkvw, gw.qkvb, k->dqkv, b.ln1, w.qkvw, C, Cq);
    layernorm_backward(NULL, gw.ln1w, gw.ln1b, k->dln1, b.residual, w.ln1w, b.ln1_mean, b.ln1_rstd, B, Ts, C);
    hooks_block_backward_end(&model->hooks, l);
}

static inline void gpt2_embed_backward(GPT2* model, int slot) {
    ActivationTensors* a = &model->acts[slot];
    OpAt at = gpt2_at(model, slot, -1);
    model->root_in_pass = 1;
    model->ops.embedding.backward(model->ops.embedding.ctx, &at, model->root_grads.wte, model->root_grads.wpe, model->bufs.dresidual,
                                  a->inputs, model->positions, model->config.channels);
}

static inline void gpt2_backward_end(GPT2* model) { hooks_backward_end(&model->hooks); }

// ---------------------------------------------------------------------------------------
// The whole model on one micro-batch (slot 0), composed of the pieces: what a rank that holds
// every layer runs, and what the tests call.

static inline void gpt2_forward(GPT2* model, const int* inputs, int B, int T) {
    gpt2_set_batch(model, 0, inputs, B, T);
    model->B = B;
    model->T = T;
    gpt2_forward_begin(model);
    if (model->place.has_embedding) { gpt2_embed_forward(model, 0); }
    for (int l = model->place.layer_begin; l < model->place.layer_end; l++) { gpt2_block_forward(model, 0, l); }
    if (model->place.has_head) { gpt2_head_forward(model, 0); }
}

static inline float gpt2_classifier(GPT2* model, const int* targets, const float* weights, float dloss, int write_dlogits) {
    return gpt2_head_loss(model, 0, targets, weights, dloss, write_dlogits);
}

static inline void gpt2_backward(GPT2* model) {
    gpt2_backward_begin(model);
    if (model->place.has_head) { gpt2_head_backward(model, 0); }
    for (int l = model->place.layer_end - 1; l >= model->place.layer_begin; l--) { gpt2_block_backward(model, 0, l); }
    if (model->place.has_embedding) { gpt2_embed_backward(model, 0); }
    gpt2_backward_end(model);
}

// Copy the logits of position (b, t) of the last forward to a host array of Vp floats.
static inline void gpt2_logits_to_host(GPT2* model, int b, int t, float* out) {
    if (model->place.tp > 1) { die("gpt2_logits_to_host: the logits are split over %d tensor-parallel ranks", model->place.tp); }
    size_t Vp = model->config.padded_vocab_size;
    copy_floats_to_host(out, model->logits + ((size_t)b * model->T + t) * Vp, Vp);
}

// A placement that keeps the gradients (or the parameters) elsewhere releases the model's own
// flat buffer: bucketed data parallelism packs gradients into buckets, ZeRO-3 keeps only
// parameter shards. The pointers become NULL; the hooks supply them from then on.
static inline void gpt2_release_grads(GPT2* model) {
    device_free(model->grads_memory);
    model->grads_memory = NULL;
    point_parameters(&model->grads, NULL, model->param_info);
}
static inline void gpt2_release_params(GPT2* model) {
    device_free(model->params_memory);
    model->params_memory = NULL;
    point_parameters(&model->params, NULL, model->param_info);
}

static inline void gpt2_zero_grad(GPT2* model) {
    device_memset_zero(model->grads_memory, model->num_parameters * sizeof(floatX));
}

// ---------------------------------------------------------------------------------------
// Update: global gradient norm, clipping (if grad_clip > 0), AdamW on every tensor.
// Returns the norm before clipping.

static inline float gpt2_grad_norm(GPT2* model) {
    float norm_sq;
    global_norm_squared(model->norm_squared, model->grads_memory, model->num_parameters);
    copy_device_to_host(&norm_sq, model->norm_squared, sizeof(float));
    return sqrtf(norm_sq);
}

// AdamW state (and the fp32 master copy where the backend has one) for every parameter.
static inline void gpt2_allocate_optimizer(GPT2* model) {
    model->opt_offset = 0;
    model->opt_count = model->num_parameters;
    size_t bytes = model->num_parameters * sizeof(float);
    model->m_memory = (float*)device_malloc(bytes);
    model->v_memory = (float*)device_malloc(bytes);
    device_memset_zero(model->m_memory, bytes);
    device_memset_zero(model->v_memory, bytes);
    if (BACKEND_MASTER_WEIGHTS) {   // the fp32 copy AdamW updates; params get it rounded to bf16
        model->master_memory = (float*)device_malloc(bytes);
        convert_floatX_to_float(model->master_memory, model->params_memory, model->num_parameters);
    }
}

static inline float gpt2_update(GPT2* model, float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_clip) {
    if (model->m_memory == NULL) { gpt2_allocate_optimizer(model); }
    float norm = gpt2_grad_norm(model) / model->loss_scale;   // the norm of the loss's gradient (unscaled)
    if (!isfinite(norm) && model->skip_nonfinite) { return norm; }   // the step is skipped: no AdamW, t unchanged
    // clipping, and 1/S: AdamW reads S x gradient and scales it in fp32
    float grad_scale = ((grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f) / model->loss_scale;
    model->step += 1;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
        if (p->numel == 0) { continue; }
        adamw_update(model->params_memory + p->offset, model->master_memory ? model->master_memory + p->offset : NULL,
                     model->grads_memory + p->offset,
                     model->m_memory + p->offset, model->v_memory + p->offset, p->numel, lr, beta1, beta2,
                     eps, p->decay ? weight_decay : 0.0f, model->step, grad_scale,
                     (unsigned int)(model->step * 1000003u + i));
    }
    return norm;
}

// FLOPs of one training step per token (forward + backward = 3 x forward): 6 per parameter
// in the matmuls, plus attention's QK^T and AV, 12 * L * C * T (PaLM's estimate). The whole
// model's: a sharded rank does its share.
static inline double gpt2_flops_per_token(const GPT2* model, int T) {
    const GPT2Config* c = &model->config;
    double params = (double)model->num_parameters_full;
    if (gpt2_is_moe(c)) {   // a token runs through k of the E experts of an MoE block: count the active ones
        params -= (double)gpt2_moe_layers(c) * (c->num_experts - c->moe_topk) * (double)moe_expert_params(c, 1);
    }
    return 6.0 * params + 12.0 * c->num_layers * c->channels * (double)T;
}

// The auxiliary load-balancing loss of the last forward on a slot (0 for a dense model), and the
// (token, expert) pairs its capacity dropped
static inline float gpt2_aux_loss(const GPT2* model, int slot) {
    return model->moe ? moe_aux_loss(model->moe, slot, model->acts[slot].B) : 0.0f;
}
static inline size_t gpt2_moe_dropped(const GPT2* model, int slot) { return model->moe ? moe_dropped(model->moe, slot) : 0; }

static inline void gpt2_free(GPT2* model) {
    device_free(model->params_memory);
    device_free(model->grads_memory);
    device_free(model->norm_squared);
    if (model->m_memory) { device_free(model->m_memory); device_free(model->v_memory); }
    if (model->master_memory) { device_free(model->master_memory); }
    if (model->acts_memory) { device_free(model->acts_memory); free(model->losses_host); }
    moe_free(model->moe);
    memset(model, 0, sizeof(*model));
}
