// Building the model (llmc/model/gpt2.h): its shape checked, this rank's shard of the parameter
// table, the parameters allocated and initialised, the activation buffers of every slot laid out
// in one allocation, and everything freed again; the placement's hook tables installed. What the
// passes run on, set up once before the first step. Included by llmc/model/gpt2.h (it needs GPT2).
#pragma once

#include <string.h>
#include <string>
#include <vector>
#include "../rand.h"
#include "gpt2_core.h"   // GPT2
#include "moe_block.h"         // moe_create
#include "gpt2_accounting.h"   // gpt2_state_bytes

// ---------------------------------------------------------------------------------------
// The extension points: a placement's table of hooks installed and removed (llmc/model/hooks.h),
// and the ops a model starts with

static inline void gpt2_add_hooks(GPT2* model, const GPT2Hooks* h) { hooks_add(&model->hooks, h); }
static inline void gpt2_remove_hooks(GPT2* model, void* ctx) { hooks_remove(&model->hooks, ctx); }

// llmc/model/ops.h's default entries (the backend's kernels on the whole layer) and the MLP of
// llmc/model/gpt2.h. A strategy replaces entries afterwards.
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
// The shape

// Named model sizes for --model. "tiny" is the default job's model (about 1.2M parameters
// with the byte tokenizer); the gpt2* sizes are OpenAI's.
static inline int gpt2_config_preset(const char* name, GPT2Config* cfg) {
    struct { const char* name; int L, NH, C, maxT, V; } presets[] = {
        {"tiny", 6, 4, 128, 128, 257},
        {"gpt2", 12, 12, 768, 1024, 50257},
        {"gpt2-medium", 24, 16, 1024, 1024, 50257},
        {"gpt2-large", 36, 20, 1280, 1024, 50257},
        {"gpt2-xl", 48, 25, 1600, 1024, 50257},
    };
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(presets[i].name, name) == 0) {
            cfg->num_layers = presets[i].L;
            cfg->num_heads = presets[i].NH;
            cfg->channels = presets[i].C;
            cfg->max_seq_len = presets[i].maxT;
            cfg->vocab_size = presets[i].V;
            cfg->padded_vocab_size = padded_vocab(presets[i].V);
            cfg->num_experts = cfg->moe_topk = cfg->moe_every = 0;   // dense; --moe-experts makes it MoE
            cfg->moe_capacity = cfg->moe_aux = 0.0f;
            return 1;
        }
    }
    return 0;
}

static inline void gpt2_check_moe(const GPT2Config* c) {
    if (c->num_experts == 0) { return; }
    if (c->num_experts < 0 || c->moe_topk < 1 || c->moe_topk > c->num_experts) {
        die("mixture of experts: top-k %d must be between 1 and the %d experts", c->moe_topk, c->num_experts);
    }
    if (c->moe_every < 1 || c->moe_every > c->num_layers) {
        die("mixture of experts: every %d-th block must be between 1 and the %d layers", c->moe_every, c->num_layers);
    }
    if (!(c->moe_capacity > 0.0f) || !(c->moe_aux >= 0.0f)) {
        die("mixture of experts: the capacity factor (%g) must be > 0 and the aux coefficient (%g) >= 0", c->moe_capacity,
            c->moe_aux);
    }
}

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
// parameter tables, the ops (and the MoE's routing state). The planner (llmc/planner/cost_model.h)
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

// Memory a shape cannot have is refused before it is asked for, naming what needs it: a model or
// batch far beyond the machine would otherwise fail deep inside an allocation, or (Linux
// overcommits) be killed later when its pages are touched. The state of the parameters
// (gpt2_state_bytes) first; then (gpt2_activations_slots) with the activations.
static inline void gpt2_check_fits(const char* what, double bytes) {
    double have = (double)device_memory_total();
    if (bytes > have) {
        die("%s need %.1f GiB, more than the %.1f GiB of memory there is (a smaller model, --batch or --seq, or more "
            "ranks to share it)", what, bytes / 1073741824.0, have / 1073741824.0);
    }
}

// ---------------------------------------------------------------------------------------
// The parameters

// The model as a rank at `place` holds it (gpt2_build: the whole model).
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
// run draws the same numbers and keeps its slice), then copied to the device. `std` is the
// normal weights' standard deviation (GPT-2's 0.02, the table's); the residual projections get
// std / sqrt(2L), as in the table. The trainer passes --init-std (0.1 for the default job: at
// 128 channels GPT-2's 0.02 leaves the attention uniform for hundreds of steps, doc/training-tasks.md).
static inline void gpt2_init_random(GPT2* model, uint64_t seed, float std = 0.02f) {
    float scale = std / 0.02f;
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
        if (p->init == INIT_NORMAL) { rng_normal(&rng, dst, n, 0.0f, p->init_std * scale); }
        else { for (size_t j = 0; j < n; j++) { dst[j] = p->init == INIT_ONES ? 1.0f : 0.0f; } }
    }
    gpt2_set_parameters_from_full(model, host);
    free(host);
}

// ---------------------------------------------------------------------------------------
// The activations

// Activations for `slots` micro-batches of up to B x T tokens each (T <= max_seq_len). With
// dry = 1 nothing is allocated: only acts_bytes and acts_requested are set, the figures the
// memory tables print (the planner's dry model, llmc/planner/cost_model.h).
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
    // the MoE blocks' routing and expert activations: their own buffers (llmc/model/moe_block.h), sized by capacity
    if (model->moe) { moe_allocate(model->moe, c, &model->place, B, T, slots, (int)H); }
}
static inline void gpt2_allocate_activations_slots(GPT2* model, int B, int T, int slots) {
    gpt2_activations_slots(model, B, T, slots, 0);
}
static inline void gpt2_allocate_activations(GPT2* model, int B, int T) { gpt2_allocate_activations_slots(model, B, T, 1); }

// Block l's saved activations in a slot (l: global layer index; li: its index in the slot,
// whose layers are one chunk's): layer li's part of each of the slot's buffers, laid out above.
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
    // --recompute (llmc/model/recompute.h) keeps fewer: full rebuilds the whole block in the
    // scratch set, selective the attention state and the GELU output
    BlockActs b = model->scratch;
    if (model->recompute != RECOMPUTE_FULL) {
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
    }
    if (model->recompute == RECOMPUTE_NONE) {
        b.att = a->att + li * att;
        b.fch_gelu = a->fch_gelu + li * BT * H;
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
