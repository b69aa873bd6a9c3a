// GPT-2's configuration and its parameter table: every tensor, its shape, where it sits in the
// one flat buffer, how AdamW treats it and how it is initialised, in llm.c's checkpoint order:
//
//   wte (Vp, C)   wpe (maxT, C)            the embedding; wte is also the LM head (tied)
//   per block l:  ln1w, ln1b (C)           qkvw (3C, C), qkvb (3C)      attprojw (C, C), attprojb (C)
//                 ln2w, ln2b (C)           fcw (4C, C), fcb (4C)        fcprojw (C, 4C), fcprojb (C)
//   lnfw, lnfb (C)                         the final layernorm
//
// A layered tensor holds the slices of all L blocks, (L, ...), so the whole model is ONE flat
// buffer and each tensor a pointer into it (point_parameters). Parameter count:
// Vp*C + maxT*C + L*(12*C^2 + 13*C) + 2*C. A mixture-of-experts model (llmc/model/moe_block.h) has the
// MLPs of its Lm MoE blocks in five more tensors after lnfb (the dense MLP's four then hold the
// L - Lm dense blocks); a dense model has Lm = 0, llm.c's table exactly.
// This is the WHOLE model; a rank's shard of it (tp, pp, ep): llmc/model/params_shard.h.
#pragma once

#include <string.h>
#include "../common.h"
#include "../backend.h"

typedef struct {
    int max_seq_len;        // maxT: positions the model has embeddings for
    int vocab_size;         // V: real tokens
    int padded_vocab_size;  // Vp >= V, a multiple of 64 so the LM-head matmul tiles well
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    // mixture of experts (llmc/model/moe_block.h); num_experts 0 = the dense GPT-2 above
    int num_experts;        // E: experts per MoE block
    int moe_topk;           // k: experts per token
    int moe_every;          // N: block l is an MoE block iff l % N == N - 1
    float moe_capacity;     // capacity factor: an expert takes ceil(factor T k / E) tokens of a sequence
    float moe_aux;          // coefficient of the Switch load-balancing loss
} GPT2Config;

// Mixture of experts: which blocks replace their MLP by experts, and how many do.
static inline int gpt2_is_moe(const GPT2Config* c) { return c->num_experts > 0; }
static inline int moe_every_of(const GPT2Config* c) { return c->num_experts > 0 ? c->moe_every : 0; }
static inline int moe_block(int every, int l) { return every > 0 && l % every == every - 1; }
static inline int gpt2_layer_is_moe(const GPT2Config* c, int l) { return moe_block(moe_every_of(c), l); }
static inline int gpt2_moe_layers(const GPT2Config* c) { return c->num_experts > 0 ? c->num_layers / c->moe_every : 0; }
// parameters of one expert's tp shard: fc (4C x C) and its bias split over tp, fcproj (C x 4C)
// split over tp, its bias (C) whole
static inline size_t moe_expert_params(const GPT2Config* c, int tp) {
    size_t C = (size_t)c->channels;
    return 8 * C * C / tp + 4 * C / tp + C;
}

// Round the vocabulary up to a multiple of 64 (50257 -> 50304 for GPT-2, 257 -> 320 bytes+EOT).
static inline int padded_vocab(int V) { return (V + 63) / 64 * 64; }

// ---------------------------------------------------------------------------------------
// The parameter table

#define NUM_PARAMETER_TENSORS 21
#define FIRST_EXPERT_TENSOR 17   // expfcw: 17..20 are split over expert-parallel ranks, and come last

typedef struct {
    floatX *wte, *wpe;                 // (Vp, C), (maxT, C)
    floatX *ln1w, *ln1b;               // (L, C)
    floatX *qkvw, *qkvb;               // (L, 3C, C), (L, 3C)
    floatX *attprojw, *attprojb;       // (L, C, C), (L, C)
    floatX *ln2w, *ln2b;               // (L, C)
    floatX *fcw, *fcb;                 // (L, 4C, C), (L, 4C)
    floatX *fcprojw, *fcprojb;         // (L, C, 4C), (L, C)
    floatX *lnfw, *lnfb;               // (C)
    floatX *routerw;                   // (Lm, E, C)       mixture of experts (Lm = 0: dense)
    floatX *expfcw, *expfcb;           // (Lm, E, 4C, C), (Lm, E, 4C)
    floatX *expfcprojw, *expfcprojb;   // (Lm, E, C, 4C), (Lm, E, C)
} ParameterTensors;

enum { INIT_NORMAL, INIT_ZEROS, INIT_ONES };
// how tensor parallelism splits a tensor (llmc/model/params_shard.h)
enum { SHARD_REPLICATED, SHARD_COLUMNS, SHARD_HEADS, SHARD_ROWS, SHARD_VOCAB };
// which pieces of the model use a tensor outside the blocks (a bit mask)
enum { USE_BLOCK = 0, USE_EMBEDDING = 1, USE_HEAD = 2 };
// which blocks a layered tensor has a slice for
enum { LAYERS_ALL, LAYERS_DENSE, LAYERS_MOE };

typedef struct {
    const char* name;
    int ndim;
    int shape[4];       // the shape this rank holds (the full one here; a shard's: params_shard.h)
    int full[4];        // the full shape, as in the checkpoint
    size_t numel;       // elements held (0: this rank does not hold the tensor)
    size_t offset;      // in elements, into the flat buffer
    int decay;          // 1: AdamW weight decay applies (the 2-D weight matrices)
    int init;           // INIT_NORMAL / INIT_ZEROS / INIT_ONES
    float init_std;     // for INIT_NORMAL
    int layered;        // 1: the leading dimension is the layer (one slice per block)
    int shard;          // SHARD_*: how tensor parallelism splits it
    int used_by;        // outside the blocks: USE_EMBEDDING | USE_HEAD
    int norm;           // 1: a layernorm's weight or bias (under SP its gradient is a partial sum over tp)
    int layers;         // LAYERS_*: the blocks a layered tensor has slices for (its leading dimension)
    int every;          // the model's MoE period N (0: dense), to tell the blocks apart
    int experts;        // 1: the dimension after the layer is the expert, split over ep
    int ep, ep_rank;    // the place's expert split (experts: local E/ep of them; 1, 0 here)
} ParamInfo;

// The whole model's table: full shapes, offsets into the whole model's flat buffer.
static inline void gpt2_param_table(ParamInfo* t, const GPT2Config* cfg) {
    int Vp = cfg->padded_vocab_size, C = cfg->channels, L = cfg->num_layers, maxT = cfg->max_seq_len;
    int E = cfg->num_experts, Ld = L - gpt2_moe_layers(cfg), Lm = gpt2_moe_layers(cfg);
    float std = 0.02f;
    float std_resid = 0.02f / sqrtf(2.0f * L);   // residual projections: GPT-2's 1/sqrt(2L)
    const int EMB = USE_EMBEDDING, H = USE_HEAD, A = LAYERS_ALL, D = LAYERS_DENSE, M = LAYERS_MOE;
    ParamInfo table[NUM_PARAMETER_TENSORS] = {
        // name       ndim shape            full n off decay init    std   layered shard   used_by norm layers every experts ep
        {"wte",        2, {Vp, C},           {0}, 0, 0, 1, INIT_NORMAL, std,       0, SHARD_VOCAB,      EMB | H, 0, A, 0, 0, 1, 0},
        {"wpe",        2, {maxT, C},         {0}, 0, 0, 1, INIT_NORMAL, std,       0, SHARD_REPLICATED, EMB, 0, A, 0, 0, 1, 0},
        {"ln1w",       2, {L, C},            {0}, 0, 0, 0, INIT_ONES, 0,           1, SHARD_REPLICATED, 0, 1, A, 0, 0, 1, 0},
        {"ln1b",       2, {L, C},            {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_REPLICATED, 0, 1, A, 0, 0, 1, 0},
        {"qkvw",       3, {L, 3 * C, C},     {0}, 0, 0, 1, INIT_NORMAL, std,       1, SHARD_HEADS,      0, 0, A, 0, 0, 1, 0},
        {"qkvb",       2, {L, 3 * C},        {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_HEADS,      0, 0, A, 0, 0, 1, 0},
        {"attprojw",   3, {L, C, C},         {0}, 0, 0, 1, INIT_NORMAL, std_resid, 1, SHARD_ROWS,       0, 0, A, 0, 0, 1, 0},
        {"attprojb",   2, {L, C},            {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_REPLICATED, 0, 0, A, 0, 0, 1, 0},
        {"ln2w",       2, {L, C},            {0}, 0, 0, 0, INIT_ONES, 0,           1, SHARD_REPLICATED, 0, 1, A, 0, 0, 1, 0},
        {"ln2b",       2, {L, C},            {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_REPLICATED, 0, 1, A, 0, 0, 1, 0},
        {"fcw",        3, {Ld, 4 * C, C},    {0}, 0, 0, 1, INIT_NORMAL, std,       1, SHARD_COLUMNS,    0, 0, D, 0, 0, 1, 0},
        {"fcb",        2, {Ld, 4 * C},       {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_COLUMNS,    0, 0, D, 0, 0, 1, 0},
        {"fcprojw",    3, {Ld, C, 4 * C},    {0}, 0, 0, 1, INIT_NORMAL, std_resid, 1, SHARD_ROWS,       0, 0, D, 0, 0, 1, 0},
        {"fcprojb",    2, {Ld, C},           {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_REPLICATED, 0, 0, D, 0, 0, 1, 0},
        {"lnfw",       1, {C},               {0}, 0, 0, 0, INIT_ONES, 0,           0, SHARD_REPLICATED, H, 1, A, 0, 0, 1, 0},
        {"lnfb",       1, {C},               {0}, 0, 0, 0, INIT_ZEROS, 0,          0, SHARD_REPLICATED, H, 1, A, 0, 0, 1, 0},
        {"routerw",    3, {Lm, E, C},        {0}, 0, 0, 1, INIT_NORMAL, std,       1, SHARD_REPLICATED, 0, 0, M, 0, 0, 1, 0},
        {"expfcw",     4, {Lm, E, 4 * C, C}, {0}, 0, 0, 1, INIT_NORMAL, std,       1, SHARD_COLUMNS,    0, 0, M, 0, 1, 1, 0},
        {"expfcb",     3, {Lm, E, 4 * C},    {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_COLUMNS,    0, 0, M, 0, 1, 1, 0},
        {"expfcprojw", 4, {Lm, E, C, 4 * C}, {0}, 0, 0, 1, INIT_NORMAL, std_resid, 1, SHARD_ROWS,       0, 0, M, 0, 1, 1, 0},
        {"expfcprojb", 3, {Lm, E, C},        {0}, 0, 0, 0, INIT_ZEROS, 0,          1, SHARD_REPLICATED, 0, 0, M, 0, 1, 1, 0},
    };
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        ParamInfo* p = &table[i];
        memcpy(p->full, p->shape, sizeof(p->full));
        p->every = moe_every_of(cfg);
        size_t n = 1;
        for (int d = 0; d < p->ndim; d++) { n *= (size_t)p->shape[d]; }
        p->numel = n;
        p->offset = offset;
        offset += n;
        t[i] = *p;
    }
}

static inline floatX** param_tensor(ParameterTensors* p, int i) {   // table entry i's pointer
    floatX** ptrs[NUM_PARAMETER_TENSORS] = {
        &p->wte, &p->wpe, &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb, &p->attprojw, &p->attprojb,
        &p->ln2w, &p->ln2b, &p->fcw, &p->fcb, &p->fcprojw, &p->fcprojb, &p->lnfw, &p->lnfb,
        &p->routerw, &p->expfcw, &p->expfcb, &p->expfcprojw, &p->expfcprojb};
    return ptrs[i];
}

static inline void point_parameters(ParameterTensors* p, floatX* memory, const ParamInfo* table) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { *param_tensor(p, i) = memory ? memory + table[i].offset : NULL; }
}

static inline size_t param_table_total(const ParamInfo* t) {
    return t[NUM_PARAMETER_TENSORS - 1].offset + t[NUM_PARAMETER_TENSORS - 1].numel;
}

// ---------------------------------------------------------------------------------------
// The weights of one transformer block: table entries 2..13, then the MoE block's 16..20. The passes take a
// block's weights (and gradients) through this struct, not by indexing the flat buffer, so that
// the placement hooks can put them elsewhere: ZeRO-3 gathers a block's weights into a temporary
// buffer just before the block runs (llmc/parallel/dp_zero3.h).
#define NUM_BLOCK_TENSORS 17

typedef struct {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
    floatX *routerw, *expfcw, *expfcb, *expfcprojw, *expfcprojb;   // an MoE block's (NULL in a dense block)
} BlockWeights;
