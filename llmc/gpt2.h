// GPT-2: config, parameter table, forward, backward, update. Backend-agnostic: every tensor
// lives in "device" memory (host memory on the CPU backend, GPU memory on CUDA) and this file
// only calls kernels and copy functions on it, never reads it directly.
//
// Shapes: B batch, T sequence, C channels, NH heads, L layers, V vocab, Vp padded vocab.
// One transformer block (pre-LayerNorm, as GPT-2):
//   x = x + attproj( attention( qkv( ln1(x) ) ) )
//   x = x + fcproj( gelu( fc( ln2(x) ) ) )
// and around the blocks: x = wte[tokens] + wpe[positions] ... logits = lnf(x) @ wte^T (tied).
// Parameter count: Vp*C + maxT*C + L*(12*C^2 + 13*C) + 2*C.
#pragma once

#include <string.h>
#include "common.h"
#include "backend.h"
#include "rand.h"

typedef struct {
    int max_seq_len;        // maxT: positions the model has embeddings for
    int vocab_size;         // V: real tokens
    int padded_vocab_size;  // Vp >= V, a multiple of 64 so the LM-head matmul tiles well
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
} GPT2Config;

// Round the vocabulary up to a multiple of 64 (50257 -> 50304 for GPT-2, 257 -> 320 bytes+EOT).
static inline int padded_vocab(int V) { return (V + 63) / 64 * 64; }

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
            return 1;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------------------
// The parameter table: every tensor, its shape, where it sits in the one flat buffer, whether
// AdamW decays it and how it is initialised. The order is llm.c's checkpoint order.

#define NUM_PARAMETER_TENSORS 16

typedef struct {
    floatX *wte, *wpe;                 // (Vp, C), (maxT, C)
    floatX *ln1w, *ln1b;               // (L, C)
    floatX *qkvw, *qkvb;               // (L, 3C, C), (L, 3C)
    floatX *attprojw, *attprojb;       // (L, C, C), (L, C)
    floatX *ln2w, *ln2b;               // (L, C)
    floatX *fcw, *fcb;                 // (L, 4C, C), (L, 4C)
    floatX *fcprojw, *fcprojb;         // (L, C, 4C), (L, C)
    floatX *lnfw, *lnfb;               // (C)
} ParameterTensors;

enum { INIT_NORMAL, INIT_ZEROS, INIT_ONES };

typedef struct {
    const char* name;
    int ndim;
    int shape[3];
    size_t numel;
    size_t offset;   // in elements, into the flat buffer
    int decay;       // 1: AdamW weight decay applies (the 2-D weight matrices)
    int init;        // INIT_NORMAL / INIT_ZEROS / INIT_ONES
    float init_std;  // for INIT_NORMAL
} ParamInfo;

static inline void fill_param_table(ParamInfo* t, const GPT2Config* cfg) {
    int Vp = cfg->padded_vocab_size, C = cfg->channels, L = cfg->num_layers, maxT = cfg->max_seq_len;
    float std = 0.02f;
    float std_resid = 0.02f / sqrtf(2.0f * L);   // residual projections: GPT-2's 1/sqrt(2L)
    ParamInfo table[NUM_PARAMETER_TENSORS] = {
        {"wte",      2, {Vp, C, 0},        0, 0, 1, INIT_NORMAL, std},
        {"wpe",      2, {maxT, C, 0},      0, 0, 1, INIT_NORMAL, std},
        {"ln1w",     2, {L, C, 0},         0, 0, 0, INIT_ONES, 0},
        {"ln1b",     2, {L, C, 0},         0, 0, 0, INIT_ZEROS, 0},
        {"qkvw",     3, {L, 3 * C, C},     0, 0, 1, INIT_NORMAL, std},
        {"qkvb",     2, {L, 3 * C, 0},     0, 0, 0, INIT_ZEROS, 0},
        {"attprojw", 3, {L, C, C},         0, 0, 1, INIT_NORMAL, std_resid},
        {"attprojb", 2, {L, C, 0},         0, 0, 0, INIT_ZEROS, 0},
        {"ln2w",     2, {L, C, 0},         0, 0, 0, INIT_ONES, 0},
        {"ln2b",     2, {L, C, 0},         0, 0, 0, INIT_ZEROS, 0},
        {"fcw",      3, {L, 4 * C, C},     0, 0, 1, INIT_NORMAL, std},
        {"fcb",      2, {L, 4 * C, 0},     0, 0, 0, INIT_ZEROS, 0},
        {"fcprojw",  3, {L, C, 4 * C},     0, 0, 1, INIT_NORMAL, std_resid},
        {"fcprojb",  2, {L, C, 0},         0, 0, 0, INIT_ZEROS, 0},
        {"lnfw",     1, {C, 0, 0},         0, 0, 0, INIT_ONES, 0},
        {"lnfb",     1, {C, 0, 0},         0, 0, 0, INIT_ZEROS, 0},
    };
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = 1;
        for (int d = 0; d < table[i].ndim; d++) { n *= (size_t)table[i].shape[d]; }
        table[i].numel = n;
        table[i].offset = offset;
        offset += n;
        t[i] = table[i];
    }
}

static inline void point_parameters(ParameterTensors* p, floatX* memory, const ParamInfo* table) {
    floatX** ptrs[NUM_PARAMETER_TENSORS] = {
        &p->wte, &p->wpe, &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb, &p->attprojw, &p->attprojb,
        &p->ln2w, &p->ln2b, &p->fcw, &p->fcb, &p->fcprojw, &p->fcprojb, &p->lnfw, &p->lnfb};
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { *ptrs[i] = memory + table[i].offset; }
}

// The weights of one transformer block, table entries 2..13 in table order. The forward and
// backward passes take a block's weights (and gradients) through this struct, not by indexing
// the flat buffer, so that data parallelism can put them elsewhere: ZeRO-3 gathers a block's
// weights into a temporary buffer just before the block runs (llmc/parallel/zero.h).
#define NUM_BLOCK_TENSORS 12
#define FIRST_BLOCK_TENSOR 2

typedef struct {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} BlockWeights;

static inline floatX** block_tensor(BlockWeights* w, int k) {   // k = 0..11, table entry k + 2
    floatX** ptrs[NUM_BLOCK_TENSORS] = {&w->ln1w, &w->ln1b, &w->qkvw, &w->qkvb, &w->attprojw, &w->attprojb,
                                        &w->ln2w, &w->ln2b, &w->fcw, &w->fcb, &w->fcprojw, &w->fcprojb};
    return ptrs[k];
}

// Block l's weights inside a flat buffer laid out as the parameter table (tensor by tensor,
// each tensor layer by layer).
static inline BlockWeights block_weights_in(floatX* flat, const ParamInfo* table, int L, int l) {
    BlockWeights w;
    memset(&w, 0, sizeof(w));
    if (flat == NULL) { return w; }   // nothing there (ZeRO-3): the hooks fill the pointers in
    for (int k = 0; k < NUM_BLOCK_TENSORS; k++) {
        const ParamInfo* p = &table[FIRST_BLOCK_TENSOR + k];
        *block_tensor(&w, k) = flat + p->offset + (size_t)l * (p->numel / L);
    }
    return w;
}

// Hooks: where data parallelism plugs into the passes (like PyTorch's module hooks). All NULL
// on a single rank. `root` holds wte, wpe, lnfw, lnfb (the other fields are unused).
typedef struct {
    void* ctx;
    void (*forward_begin)(void* ctx, ParameterTensors* root);
    void (*block_forward_begin)(void* ctx, int l, BlockWeights* w);
    void (*block_forward_end)(void* ctx, int l);
    void (*backward_begin)(void* ctx, ParameterTensors* root, ParameterTensors* root_grads);
    void (*block_backward_begin)(void* ctx, int l, BlockWeights* w, BlockWeights* grads);
    void (*block_backward_end)(void* ctx, int l);   // block l's gradients are complete
    void (*backward_end)(void* ctx);                // wte, wpe, lnfw, lnfb gradients are complete
} GPT2Hooks;

// ---------------------------------------------------------------------------------------
// Activations saved by the forward pass for the backward pass (per layer where marked L).

#define NUM_ACTIVATION_TENSORS 19

typedef struct {
    floatX* encoded;    // (B, T, C)
    floatX* ln1;        // L x (B, T, C)
    float* ln1_mean;    // L x (B, T)      layernorm statistics stay fp32 in every backend
    float* ln1_rstd;    // L x (B, T)
    floatX* qkv;        // L x (B, T, 3C)
    floatX* atty;       // L x (B, T, C)   attention output, before the projection
    float* att;         // L x attention_state_size(B, T, NH)
    floatX* attproj;    // L x (B, T, C)
    floatX* residual2;  // L x (B, T, C)   x after the attention half of the block
    floatX* ln2;        // L x (B, T, C)
    float* ln2_mean;    // L x (B, T)
    float* ln2_rstd;    // L x (B, T)
    floatX* fch;        // L x (B, T, 4C)  fc output, before GELU
    floatX* fch_gelu;   // L x (B, T, 4C)
    floatX* fcproj;     // L x (B, T, C)
    floatX* residual3;  // L x (B, T, C)   x after the whole block
    floatX* lnf;        // (B, T, C)
    float* lnf_mean;    // (B, T)
    float* lnf_rstd;    // (B, T)
} ActivationTensors;

// Gradients of activations: only one layer's worth is alive at a time in the backward pass.
typedef struct {
    floatX* dresidual;  // (B, T, C)  gradient of the residual stream, shared by both branches
    floatX* dln;        // (B, T, C)  gradient of a layernorm output
    floatX* datty;      // (B, T, C)
    floatX* dqkv;       // (B, T, 3C)
    floatX* dfch;       // (B, T, 4C) gradient of fch_gelu, then (in place) of fch
} GradientBuffers;

typedef struct {
    GPT2Config config;
    ParamInfo param_info[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
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
    // activations, sized for at most max_B x max_T tokens
    int max_B, max_T;
    ActivationTensors acts;
    GradientBuffers bufs;
    void* acts_memory;
    size_t acts_bytes;
    int* inputs;                // (B, T) token ids, device copy
    int* targets;               // (B, T)
    float* loss_weights;        // (B, T) optional per-token loss weights
    floatX* logits;             // (B, T, Vp), overwritten by dlogits in the classifier
    float* losses;              // (B, T)
    float* norm_squared;        // 1 float: global_norm_squared output
    float* losses_host;         // host copy of losses
    int B, T;                   // shape of the last forward
    GPT2Hooks hooks;            // data parallelism's hooks (all NULL on a single rank)
} GPT2;

static inline void gpt2_build(GPT2* model, const GPT2Config* cfg) {
    memset(model, 0, sizeof(*model));
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
    model->config = *cfg;
    fill_param_table(model->param_info, cfg);
    model->num_parameters = model->param_info[NUM_PARAMETER_TENSORS - 1].offset +
                            model->param_info[NUM_PARAMETER_TENSORS - 1].numel;
    size_t bytes = model->num_parameters * sizeof(floatX);
    model->params_memory = (floatX*)device_malloc(bytes);
    model->grads_memory = (floatX*)device_malloc(bytes);
    device_memset_zero(model->grads_memory, bytes);
    point_parameters(&model->params, model->params_memory, model->param_info);
    point_parameters(&model->grads, model->grads_memory, model->param_info);
    model->norm_squared = (float*)device_malloc(sizeof(float));
}

// GPT-2 initialisation, drawn on the host for the full tensor in table order (so a sharded
// run can draw the same full tensor and keep its slice), then copied to the device.
static inline void gpt2_init_random(GPT2* model, uint64_t seed) {
    Rng rng;
    rng_init(&rng, seed);
    float* host = (float*)malloc(model->num_parameters * sizeof(float));
    if (host == NULL) { die("out of host memory for %zu parameters", model->num_parameters); }
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
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
    copy_floats_to_device(model->params_memory, host, model->num_parameters);
    free(host);
}

// Allocate the activations for batches of up to B x T tokens (T <= max_seq_len).
static inline void gpt2_allocate_activations(GPT2* model, int B, int T) {
    const GPT2Config* c = &model->config;
    if (T > c->max_seq_len) { die("sequence length %d exceeds the model's maximum %d", T, c->max_seq_len); }
    if (B <= 0 || T <= 0) { die("batch (%d) and sequence length (%d) must be positive", B, T); }
    size_t L = c->num_layers, C = c->channels, BT = (size_t)B * T, Vp = c->padded_vocab_size;
    size_t att = attention_state_size(B, T, c->num_heads);
    // (pointer, element count, element size) for every buffer, carved from one allocation
    struct { void** ptr; size_t count; size_t elsize; } tensors[] = {
        {(void**)&model->acts.encoded, BT * C, sizeof(floatX)},
        {(void**)&model->acts.ln1, L * BT * C, sizeof(floatX)},
        {(void**)&model->acts.ln1_mean, L * BT, sizeof(float)},
        {(void**)&model->acts.ln1_rstd, L * BT, sizeof(float)},
        {(void**)&model->acts.qkv, L * BT * 3 * C, sizeof(floatX)},
        {(void**)&model->acts.atty, L * BT * C, sizeof(floatX)},
        {(void**)&model->acts.att, L * att, sizeof(float)},
        {(void**)&model->acts.attproj, L * BT * C, sizeof(floatX)},
        {(void**)&model->acts.residual2, L * BT * C, sizeof(floatX)},
        {(void**)&model->acts.ln2, L * BT * C, sizeof(floatX)},
        {(void**)&model->acts.ln2_mean, L * BT, sizeof(float)},
        {(void**)&model->acts.ln2_rstd, L * BT, sizeof(float)},
        {(void**)&model->acts.fch, L * BT * 4 * C, sizeof(floatX)},
        {(void**)&model->acts.fch_gelu, L * BT * 4 * C, sizeof(floatX)},
        {(void**)&model->acts.fcproj, L * BT * C, sizeof(floatX)},
        {(void**)&model->acts.residual3, L * BT * C, sizeof(floatX)},
        {(void**)&model->acts.lnf, BT * C, sizeof(floatX)},
        {(void**)&model->acts.lnf_mean, BT, sizeof(float)},
        {(void**)&model->acts.lnf_rstd, BT, sizeof(float)},
        {(void**)&model->bufs.dresidual, BT * C, sizeof(floatX)},
        {(void**)&model->bufs.dln, BT * C, sizeof(floatX)},
        {(void**)&model->bufs.datty, BT * C, sizeof(floatX)},
        {(void**)&model->bufs.dqkv, BT * 3 * C, sizeof(floatX)},
        {(void**)&model->bufs.dfch, BT * 4 * C, sizeof(floatX)},
        {(void**)&model->logits, BT * Vp, sizeof(floatX)},
        {(void**)&model->losses, BT, sizeof(float)},
        {(void**)&model->inputs, BT, sizeof(int)},
        {(void**)&model->targets, BT, sizeof(int)},
        {(void**)&model->loss_weights, BT, sizeof(float)},
    };
    size_t n = sizeof(tensors) / sizeof(tensors[0]);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) { total += ceil_div(tensors[i].count * tensors[i].elsize, 64) * 64; }
    if (model->acts_memory) { device_free(model->acts_memory); free(model->losses_host); }
    model->acts_memory = device_malloc(total);
    model->acts_bytes = total;
    char* base = (char*)model->acts_memory;
    for (size_t i = 0; i < n; i++) {
        *tensors[i].ptr = base;
        base += ceil_div(tensors[i].count * tensors[i].elsize, 64) * 64;   // keep 64-byte alignment
    }
    model->losses_host = (float*)malloc(BT * sizeof(float));
    model->max_B = B;
    model->max_T = T;
}

// ---------------------------------------------------------------------------------------
// Forward: tokens (host array, B x T) -> logits (device, B x T x Vp).

static inline void gpt2_forward(GPT2* model, const int* inputs, int B, int T) {
    const GPT2Config* cfg = &model->config;
    if (B > model->max_B || T > model->max_T) {
        die("batch %dx%d is larger than the %dx%d the activations were allocated for", B, T, model->max_B, model->max_T);
    }
    int L = cfg->num_layers, NH = cfg->num_heads, C = cfg->channels, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t att_size = attention_state_size(B, T, NH);
    model->B = B;
    model->T = T;
    copy_host_to_device(model->inputs, inputs, BT * sizeof(int));

    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    GPT2Hooks* h = &model->hooks;
    if (h->forward_begin) { h->forward_begin(h->ctx, &p); }
    encoder_forward(a.encoded, model->inputs, p.wte, p.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        BlockWeights w = block_weights_in(model->params_memory, model->param_info, L, l);
        if (h->block_forward_begin) { h->block_forward_begin(h->ctx, l, &w); }
        floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
        // this layer's weights and saved activations
        floatX* ln1 = a.ln1 + l * BT * C;
        float* ln1_mean = a.ln1_mean + l * BT;
        float* ln1_rstd = a.ln1_rstd + l * BT;
        floatX* qkv = a.qkv + l * BT * 3 * C;
        floatX* atty = a.atty + l * BT * C;
        float* att = a.att + l * att_size;
        floatX* attproj = a.attproj + l * BT * C;
        floatX* residual2 = a.residual2 + l * BT * C;
        floatX* ln2 = a.ln2 + l * BT * C;
        float* ln2_mean = a.ln2_mean + l * BT;
        float* ln2_rstd = a.ln2_rstd + l * BT;
        floatX* fch = a.fch + l * BT * 4 * C;
        floatX* fch_gelu = a.fch_gelu + l * BT * 4 * C;
        floatX* fcproj = a.fcproj + l * BT * C;
        floatX* residual3 = a.residual3 + l * BT * C;

        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, w.ln1w, w.ln1b, B, T, C);
        matmul_forward(qkv, ln1, w.qkvw, w.qkvb, B, T, C, 3 * C);
        attention_forward(atty, att, qkv, B, T, C, NH);
        matmul_forward(attproj, atty, w.attprojw, w.attprojb, B, T, C, C);
        residual_forward(residual2, residual, attproj, BT * C);
        layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, w.ln2w, w.ln2b, B, T, C);
        matmul_forward(fch, ln2, w.fcw, w.fcb, B, T, C, 4 * C);
        gelu_forward(fch_gelu, fch, BT * 4 * C);
        matmul_forward(fcproj, fch_gelu, w.fcprojw, w.fcprojb, B, T, 4 * C, C);
        residual_forward(residual3, residual2, fcproj, BT * C);
        if (h->block_forward_end) { h->block_forward_end(h->ctx, l); }
    }
    floatX* last = a.residual3 + (L - 1) * BT * C;
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, B, T, C);
    matmul_forward(model->logits, a.lnf, p.wte, NULL, B, T, C, Vp);   // tied: the LM head is wte
}

// Cross-entropy on the logits of the last forward. targets (and optional per-token weights)
// are host arrays of B x T. Returns the sum over tokens of w_i * CE_i; the caller divides by
// the number of tokens it averages over. With dloss != 0 the logits are overwritten by the
// logit gradients (scaled by dloss) for gpt2_backward.
static inline float gpt2_classifier(GPT2* model, const int* targets, const float* weights, float dloss, int write_dlogits) {
    int B = model->B, T = model->T, BT = B * T;
    copy_host_to_device(model->targets, targets, (size_t)BT * sizeof(int));
    if (weights) { copy_host_to_device(model->loss_weights, weights, (size_t)BT * sizeof(float)); }
    fused_classifier(model->logits, model->losses, weights ? model->loss_weights : NULL, model->targets, dloss,
                     B, T, model->config.vocab_size, model->config.padded_vocab_size, write_dlogits);
    copy_device_to_host(model->losses_host, model->losses, (size_t)BT * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += model->losses_host[i]; }
    return (float)sum;
}

// Copy the logits of position (b, t) of the last forward to a host array of Vp floats.
static inline void gpt2_logits_to_host(GPT2* model, int b, int t, float* out) {
    size_t Vp = model->config.padded_vocab_size;
    copy_floats_to_host(out, model->logits + ((size_t)b * model->T + t) * Vp, Vp);
}

static inline void gpt2_zero_grad(GPT2* model) {
    device_memset_zero(model->grads_memory, model->num_parameters * sizeof(floatX));
}

// ---------------------------------------------------------------------------------------
// Backward: from the dlogits left by gpt2_classifier to parameter gradients, which are
// ACCUMULATED (+=) so that several micro-steps add up before one update.
// The residual add's gradient is the identity into both of its inputs, so one buffer,
// dresidual, carries the residual stream's gradient down through all the layers; each
// branch reads it and each layernorm backward adds its input gradient into it.

static inline void gpt2_backward(GPT2* model) {
    const GPT2Config* cfg = &model->config;
    int B = model->B, T = model->T;
    int L = cfg->num_layers, NH = cfg->num_heads, C = cfg->channels, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t att_size = attention_state_size(B, T, NH);
    ParameterTensors p = model->params, g = model->grads;
    ActivationTensors a = model->acts;
    GradientBuffers d = model->bufs;
    GPT2Hooks* h = &model->hooks;
    if (h->backward_begin) { h->backward_begin(h->ctx, &p, &g); }

    // LM head and final layernorm
    matmul_backward(d.dln, g.wte, NULL, model->logits, a.lnf, p.wte, B, T, C, Vp);
    device_memset_zero(d.dresidual, BT * C * sizeof(floatX));
    floatX* last = a.residual3 + (L - 1) * BT * C;
    layernorm_backward(d.dresidual, g.lnfw, g.lnfb, d.dln, last, p.lnfw, a.lnf_mean, a.lnf_rstd, B, T, C);

    for (int l = L - 1; l >= 0; l--) {
        floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
        floatX* ln1 = a.ln1 + l * BT * C;
        floatX* qkv = a.qkv + l * BT * 3 * C;
        floatX* atty = a.atty + l * BT * C;
        float* att = a.att + l * att_size;
        floatX* residual2 = a.residual2 + l * BT * C;
        floatX* ln2 = a.ln2 + l * BT * C;
        floatX* fch = a.fch + l * BT * 4 * C;
        floatX* fch_gelu = a.fch_gelu + l * BT * 4 * C;
        BlockWeights w = block_weights_in(model->params_memory, model->param_info, L, l);
        BlockWeights gw = block_weights_in(model->grads_memory, model->param_info, L, l);
        if (h->block_backward_begin) { h->block_backward_begin(h->ctx, l, &w, &gw); }

        // MLP half: dresidual holds d(residual3) = d(fcproj) = d(residual2) so far
        matmul_backward(d.dfch, gw.fcprojw, gw.fcprojb, d.dresidual, fch_gelu, w.fcprojw, B, T, 4 * C, C);
        gelu_backward(d.dfch, fch, d.dfch, BT * 4 * C);
        matmul_backward(d.dln, gw.fcw, gw.fcb, d.dfch, ln2, w.fcw, B, T, C, 4 * C);
        layernorm_backward(d.dresidual, gw.ln2w, gw.ln2b, d.dln, residual2, w.ln2w,
                           a.ln2_mean + l * BT, a.ln2_rstd + l * BT, B, T, C);
        // attention half: dresidual now holds d(residual2) = d(attproj) = d(residual)
        matmul_backward(d.datty, gw.attprojw, gw.attprojb, d.dresidual, atty, w.attprojw, B, T, C, C);
        attention_backward(d.dqkv, d.datty, qkv, att, B, T, C, NH);
        matmul_backward(d.dln, gw.qkvw, gw.qkvb, d.dqkv, ln1, w.qkvw, B, T, C, 3 * C);
        layernorm_backward(d.dresidual, gw.ln1w, gw.ln1b, d.dln, residual, w.ln1w,
                           a.ln1_mean + l * BT, a.ln1_rstd + l * BT, B, T, C);
        if (h->block_backward_end) { h->block_backward_end(h->ctx, l); }
    }
    encoder_backward(g.wte, g.wpe, d.dresidual, model->inputs, B, T, C);
    if (h->backward_end) { h->backward_end(h->ctx); }
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
    float norm = gpt2_grad_norm(model);
    float grad_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
    model->step += 1;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
        adamw_update(model->params_memory + p->offset, model->master_memory ? model->master_memory + p->offset : NULL,
                     model->grads_memory + p->offset,
                     model->m_memory + p->offset, model->v_memory + p->offset, p->numel, lr, beta1, beta2,
                     eps, p->decay ? weight_decay : 0.0f, model->step, grad_scale,
                     (unsigned int)(model->step * 1000003u + i));
    }
    return norm;
}

// FLOPs of one training step per token (forward + backward = 3 x forward): 6 per parameter
// in the matmuls, plus attention's QK^T and AV, 12 * L * C * T (PaLM's estimate).
static inline double gpt2_flops_per_token(const GPT2* model, int T) {
    const GPT2Config* c = &model->config;
    return 6.0 * (double)model->num_parameters + 12.0 * c->num_layers * c->channels * (double)T;
}

static inline void gpt2_free(GPT2* model) {
    device_free(model->params_memory);
    device_free(model->grads_memory);
    device_free(model->norm_squared);
    if (model->m_memory) { device_free(model->m_memory); device_free(model->v_memory); }
    if (model->master_memory) { device_free(model->master_memory); }
    if (model->acts_memory) { device_free(model->acts_memory); free(model->losses_host); }
    memset(model, 0, sizeof(*model));
}
