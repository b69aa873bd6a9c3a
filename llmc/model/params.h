// GPT-2's configuration and its parameter table: every tensor, its shape, where it sits in
// the one flat buffer, how AdamW treats it, how it is initialised, and how it is SHARDED.
//
// A rank holds a shard of the model, described by its place (GPT2Place):
//   tensor parallelism   tp ranks split the matrices; this rank is tp_rank of them
//   pipeline stage       this rank runs layers [layer_begin, layer_end), or with interleaved
//                        stages v chunks of them: [begin + c stride, end + c stride), c < v
//   embedding / head     whether it runs the embedding (first stage) and the head (last stage)
// One rank with the whole model is {tp 1, layers [0, L), embedding, head}: the table is then
// exactly llm.c's. Every tensor carries a shard rule (Megatron-LM's split, Shoeybi et al. 2019):
//
//   rule               tensors              what rank t of tp keeps            y = x W^T + b
//   REPLICATED         wpe, ln*, lnf*,      everything
//                      attprojb, fcprojb    (row-parallel biases: added once, after the sum)
//   COLUMNS            fcw (4C, C), fcb     out rows [t 4C/tp, (t+1) 4C/tp)    column-parallel
//   HEADS              qkvw (3C, C), qkvb   the q, k and v rows of heads       column-parallel,
//                                           [t NH/tp, (t+1) NH/tp)             by attention head
//   ROWS               attprojw (C, C),     in columns [t K/tp, (t+1) K/tp)    row-parallel
//                      fcprojw (C, 4C)
//   VOCAB              wte (Vp, C)          vocabulary rows [t Vs, (t+1) Vs)   vocab-parallel
//                                           Vs = tp_vocab_rows(Vp, tp): Vp/tp, or more (padding)
//
// A mixture-of-experts model (llmc/model/moe.h: --moe-experts E, every N-th block) has two more
// kinds of layered tensor. The dense MLP's fcw, fcb, fcprojw, fcprojb hold the DENSE blocks
// only (L - Lm of them); the MoE blocks' tensors, appended after lnfb, hold the Lm MoE blocks:
//   routerw (Lm, E, C)                                        replicated (every rank routes)
//   expfcw (Lm, E, 4C, C), expfcb (Lm, E, 4C)                 COLUMNS inside each expert
//   expfcprojw (Lm, E, C, 4C), expfcprojb (Lm, E, C)          ROWS / replicated, as the MLP's
// and expert parallelism (ep ranks, llmc/parallel/ep.h) splits the expert dimension: rank
// ep_rank keeps experts [ep_rank E/ep, (ep_rank+1) E/ep). A dense model has Lm = 0: the table
// is llm.c's exactly (the five MoE tensors are empty).
//
// Layered tensors (leading dimension L, one slice per block) keep only the stage's layers; the
// embedding's and the head's tensors exist only on the ranks that run them (numel 0
// elsewhere; wte belongs to both, as the tied LM head). The local shapes, numel and offsets in
// the table follow from the place, so memory, the optimizer and the data-parallel buckets all
// see the local model. Checkpoints are always the full model: param_slice cuts a rank's shard
// out of the full tensor (loading, random init: draw the full tensor, keep the slice) and
// param_unslice puts it back (saving), so any sharded run reads and writes the one llm.c file.
// Parameter count (full): Vp*C + maxT*C + L*(12*C^2 + 13*C) + 2*C.
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
    // mixture of experts (llmc/model/moe.h); num_experts 0 = the dense GPT-2 above
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

// The vocabulary under tensor parallelism. tp ranks split wte's rows (and the tied LM head's
// logits) into tp equal blocks of Vs rows. Where tp divides Vp, Vs = Vp/tp. Where it does not
// (Vp 320 and tp 3), the run pads the vocabulary further, as Megatron does (it pads to a
// multiple of 128 x tp): to the next multiple of 64 x tp, so every rank holds the same number
// of rows and that number is a multiple of 64, as Vp itself is (320 -> 384 = 3 x 128 for tp 3;
// GPT-2's 50304 -> 50560 = 5 x 10112 for tp 5). Every row past Vp is like the rows between V
// and Vp: zero, and zero for good. No token selects it, the loss and the sampler read only the
// first V logits (the vocab-parallel loss writes 0 into the padded columns' dlogits), so its
// gradient is 0, and AdamW leaves a zero parameter with a zero gradient at zero.
// These extra rows exist only in the shards (and in the run's rows of logits, tp Vs wide): the
// config, the full parameter table, checkpoints (header[7]) and the training state keep Vp.
// Loading pads (param_slice_copy gives a row past Vp the value 0) and saving strips (such a
// row has no place in the full tensor and is not written), so a checkpoint or a state written
// at tp 3 is laid out exactly as a one-rank run's, and loads on any mesh.
static inline int tp_vocab_rows(int Vp, int tp) {
    if (Vp % tp == 0) { return Vp / tp; }
    return (Vp + 64 * tp - 1) / (64 * tp) * 64;
}
static inline int tp_padded_vocab(int Vp, int tp) { return tp * tp_vocab_rows(Vp, tp); }

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

// ---------------------------------------------------------------------------------------
// A rank's place in the model.

typedef struct {
    int tp, tp_rank;               // tensor-parallel size and this rank's index
    int layer_begin, layer_end;    // the pipeline stage's layers [begin, end)
    int has_embedding, has_head;   // first stage: wte/wpe lookup; last stage: lnf, LM head, loss
    int sp;                        // sequence parallelism: the residual stream (layernorms, residual
                                   // adds, the embedding's output) holds T/tp of the tokens here
    int chunks, chunk_stride;      // interleaved pipeline: v model chunks of end - begin layers each,
                                   // chunk c at [begin + c stride, end + c stride) (1 and 0 otherwise)
    int ep, ep_rank;               // expert parallelism: this rank holds experts [ep_rank E/ep, ...)
} GPT2Place;

static inline GPT2Place gpt2_place_whole(const GPT2Config* c) {
    GPT2Place p = {1, 0, 0, c->num_layers, 1, 1, 0, 1, 0, 1, 0};
    return p;
}
static inline int gpt2_place_is_whole(const GPT2Place* p, const GPT2Config* c) {
    return p->tp == 1 && p->layer_begin == 0 && p->layer_end == c->num_layers && p->has_embedding && p->has_head &&
           p->chunks == 1 && p->ep == 1;
}
static inline int gpt2_place_experts(const GPT2Place* p, const GPT2Config* c) { return c->num_experts / p->ep; }
// The stage's layers: chunks x (end - begin) of them, numbered locally 0, 1, ... chunk by chunk.
static inline int gpt2_place_chunk_layers(const GPT2Place* p) { return p->layer_end - p->layer_begin; }
static inline int gpt2_place_num_layers(const GPT2Place* p) { return p->chunks * gpt2_place_chunk_layers(p); }
// global layer of local layer li, and back (-1: not on this stage)
static inline int gpt2_place_layer(const GPT2Place* p, int li) {
    int n = gpt2_place_chunk_layers(p);
    return p->layer_begin + (li / n) * p->chunk_stride + li % n;
}
static inline int gpt2_place_local(const GPT2Place* p, int l) {
    int n = gpt2_place_chunk_layers(p);
    for (int c = 0; c < p->chunks; c++) {
        int b = p->layer_begin + c * p->chunk_stride;
        if (l >= b && l < b + n) { return c * n + (l - b); }
    }
    return -1;
}
// tokens of a T-token sequence that this rank's residual stream holds
static inline int gpt2_place_stream_tokens(const GPT2Place* p, int T) { return p->sp ? T / p->tp : T; }

// Every rank that finds its place impossible says so (the callers run this on every rank).
static inline void gpt2_place_check(const GPT2Place* p, const GPT2Config* c) {
    if (p->tp < 1 || p->tp_rank < 0 || p->tp_rank >= p->tp) { die("tensor-parallel index %d of %d is invalid", p->tp_rank, p->tp); }
    if (p->layer_begin < 0 || p->layer_end > c->num_layers || p->layer_begin >= p->layer_end) {
        die("a pipeline stage needs at least one of the %d layers: [%d, %d) is empty or out of range", c->num_layers,
            p->layer_begin, p->layer_end);
    }
    if (p->chunks < 1 || (p->chunks > 1 && (p->chunk_stride < p->layer_end - p->layer_begin ||
                                            p->layer_end + (p->chunks - 1) * p->chunk_stride > c->num_layers))) {
        die("%d interleaved chunks of layers [%d, %d) every %d layers do not fit the model's %d layers", p->chunks,
            p->layer_begin, p->layer_end, p->chunk_stride, c->num_layers);
    }
    if (c->num_heads % p->tp != 0) { die("tensor parallelism %d does not divide the %d attention heads", p->tp, c->num_heads); }
    if ((4 * c->channels) % p->tp != 0 || c->channels % p->tp != 0) {
        die("tensor parallelism %d does not divide the channels (%d) of the MLP and the projections", p->tp, c->channels);
    }
    if (p->sp && p->tp < 2) { die("sequence parallelism splits the sequence over tensor-parallel ranks: it needs tp >= 2"); }
    // (any tp splits the vocabulary: tp_vocab_rows pads it further where tp does not divide Vp)
    if (p->ep < 1 || p->ep_rank < 0 || p->ep_rank >= p->ep) { die("expert-parallel index %d of %d is invalid", p->ep_rank, p->ep); }
    if (p->ep > 1 && (c->num_experts == 0 || c->num_experts % p->ep != 0)) {
        die("expert parallelism %d does not divide the %d experts", p->ep, c->num_experts);
    }
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

// ---------------------------------------------------------------------------------------
// The parameter table. The order is llm.c's checkpoint order.

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
enum { SHARD_REPLICATED, SHARD_COLUMNS, SHARD_HEADS, SHARD_ROWS, SHARD_VOCAB };
static inline const char* shard_name(int rule) {
    static const char* names[] = {"replicated", "columns", "heads", "rows", "vocab"};
    return names[rule];
}
// which pieces of the model use a tensor outside the blocks (a bit mask)
enum { USE_BLOCK = 0, USE_EMBEDDING = 1, USE_HEAD = 2 };
// which blocks a layered tensor has a slice for
enum { LAYERS_ALL, LAYERS_DENSE, LAYERS_MOE };
static inline int layer_in_set(int set, int every, int l) { return set == LAYERS_ALL || (set == LAYERS_MOE) == moe_block(every, l); }
// the slice of global block l among the blocks of its set (l / N MoE blocks come before block l)
static inline int layer_set_index(int set, int every, int l) {
    if (set == LAYERS_ALL || every == 0) { return l; }
    return set == LAYERS_MOE ? l / every : l - l / every;
}

typedef struct {
    const char* name;
    int ndim;
    int shape[4];       // the LOCAL shape (this rank's shard)
    int full[4];        // the full shape, as in the checkpoint
    size_t numel;       // local elements (0: this rank does not hold the tensor)
    size_t offset;      // in elements, into this rank's flat buffer
    int decay;          // 1: AdamW weight decay applies (the 2-D weight matrices)
    int init;           // INIT_NORMAL / INIT_ZEROS / INIT_ONES
    float init_std;     // for INIT_NORMAL
    int layered;        // 1: the leading dimension is the layer (one slice per block)
    int shard;          // SHARD_*: how tensor parallelism splits it
    int used_by;        // outside the blocks: USE_EMBEDDING | USE_HEAD
    int norm;           // 1: a layernorm's weight or bias. Under sequence parallelism each tp rank
                        // normalises T/tp of the tokens, so its gradient is a partial sum over tp
    int layers;         // LAYERS_*: the blocks a layered tensor has slices for (its leading dimension)
    int every;          // the model's MoE period N (0: dense), to tell the blocks apart
    int experts;        // 1: the dimension after the layer is the expert, split over ep
    int ep, ep_rank;    // the place's expert split (experts: local E/ep of them)
} ParamInfo;

// The place's blocks that a layered tensor has a slice for: the local slice of local layer li
// (-1: none), and the global block of local slice s.
static inline int param_local_slice(const ParamInfo* p, const GPT2Place* place, int li) {
    if (!layer_in_set(p->layers, p->every, gpt2_place_layer(place, li))) { return -1; }
    int k = 0;
    for (int j = 0; j < li; j++) { k += layer_in_set(p->layers, p->every, gpt2_place_layer(place, j)); }
    return k;
}
static inline int param_slice_block(const ParamInfo* p, const GPT2Place* place, int s) {
    for (int li = 0, k = 0; li < gpt2_place_num_layers(place); li++) {
        if (!layer_in_set(p->layers, p->every, gpt2_place_layer(place, li))) { continue; }
        if (k++ == s) { return gpt2_place_layer(place, li); }
    }
    die("parameter table: '%s' has no slice %d on this stage", p->name, s);
    return -1;
}

static inline void fill_param_table(ParamInfo* t, const GPT2Config* cfg, const GPT2Place* place) {
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
        p->ep = place->ep;
        p->ep_rank = place->ep_rank;
        int d0 = p->layered ? 1 + p->experts : 0;   // the first dimension inside one layer (and expert)
        int held = p->layered || (p->used_by & USE_EMBEDDING && place->has_embedding) ||
                   (p->used_by & USE_HEAD && place->has_head);
        if (p->layered) {   // the stage's blocks of the tensor's set
            int n = 0;
            for (int li = 0; li < gpt2_place_num_layers(place); li++) {
                n += layer_in_set(p->layers, p->every, gpt2_place_layer(place, li));
            }
            p->shape[0] = n;
        }
        if (p->experts) { p->shape[1] /= place->ep; }
        if (p->shard == SHARD_COLUMNS || p->shard == SHARD_HEADS) { p->shape[d0] /= place->tp; }
        if (p->shard == SHARD_VOCAB) { p->shape[d0] = tp_vocab_rows(p->shape[d0], place->tp); }
        if (p->shard == SHARD_ROWS) { p->shape[d0 + 1] /= place->tp; }
        size_t n = held ? 1 : 0;
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
// Shards of full tensors (host memory, fp32). A tensor is seen as [layers][experts][rows][cols]:
// rows = the first dimension inside a layer (and expert), cols = the rest; experts = 1 for the
// tensors without an expert dimension. COLUMNS and VOCAB keep a block of rows, ROWS a block of
// cols, HEADS a block of rows in each of the q, k, v thirds; ep keeps a block of experts; a
// layered tensor keeps the slices of the stage's blocks of its set.

static inline void param_slice_geometry(const ParamInfo* p, size_t* nlayers, size_t* nexp, size_t* rows, size_t* cols) {
    int d0 = p->layered ? 1 + p->experts : 0;
    *nlayers = p->layered ? (size_t)p->shape[0] : 1;
    *nexp = p->experts ? (size_t)p->full[1] : 1;
    *rows = (size_t)p->full[d0];
    *cols = 1;
    for (int d = d0 + 1; d < p->ndim; d++) { *cols *= (size_t)p->full[d]; }
}

// A shard's rows of one (layer, expert) slice of a tensor whose full slice has `rows` rows, and
// how many of them exist in the full tensor: all, except the padding rows of a vocab shard past
// Vp (tp_vocab_rows), which are always the last ones of the shard. A padding row reads as 0
// and is never written back.
static inline size_t param_local_rows(const ParamInfo* p, const GPT2Place* place, size_t rows) {
    if (p->shard == SHARD_VOCAB) { return (size_t)tp_vocab_rows((int)rows, place->tp); }
    return p->shard == SHARD_ROWS || p->shard == SHARD_REPLICATED ? rows : rows / (size_t)place->tp;
}
static inline size_t param_real_rows(const ParamInfo* p, const GPT2Place* place, size_t rows) {
    size_t lrows = param_local_rows(p, place, rows);
    if (p->shard != SHARD_VOCAB) { return lrows; }
    size_t first = (size_t)place->tp_rank * lrows;   // the shard's first row in the full tensor
    return first >= rows ? 0 : rows - first < lrows ? rows - first : lrows;
}

// index inside one (layer, expert) slice of the full tensor of local row r, local col c (a
// vocab shard's padding row: past the slice)
static inline size_t param_full_in_slice(const ParamInfo* p, const GPT2Place* place, size_t rows, size_t cols, size_t r,
                                         size_t c) {
    size_t tp = (size_t)place->tp, t = (size_t)place->tp_rank, fr = r, fc = c;
    if (p->shard == SHARD_COLUMNS) { fr = t * (rows / tp) + r; }
    if (p->shard == SHARD_VOCAB) { fr = t * (size_t)tp_vocab_rows((int)rows, (int)tp) + r; }
    if (p->shard == SHARD_HEADS) {   // local rows: [q of my heads][k of my heads][v of my heads]
        size_t third = rows / 3, mine = third / tp;
        fr = (r / mine) * third + t * mine + r % mine;
    }
    if (p->shard == SHARD_ROWS) { fc = t * (cols / tp) + c; }
    return fr * cols + fc;
}

// index in the full tensor of local element (local slice l, local expert e, local row r, local col c)
static inline size_t param_full_index(const ParamInfo* p, const GPT2Place* place, size_t l, size_t e, size_t r, size_t c) {
    size_t nl, ne, rows, cols;
    param_slice_geometry(p, &nl, &ne, &rows, &cols);
    size_t fe = p->experts ? (size_t)place->ep_rank * (ne / (size_t)place->ep) + e : e;
    size_t layer = p->layered ? (size_t)layer_set_index(p->layers, p->every, param_slice_block(p, place, (int)l)) : 0;
    return (layer * ne + fe) * rows * cols + param_full_in_slice(p, place, rows, cols, r, c);
}

// full -> local (to_local = 1) or local -> full (0), for one tensor
static inline void param_slice_copy(const ParamInfo* p, const GPT2Place* place, float* full, float* local, int to_local) {
    if (p->numel == 0) { return; }
    size_t nl, ne, rows, cols;
    param_slice_geometry(p, &nl, &ne, &rows, &cols);
    size_t lexp = p->experts ? ne / (size_t)place->ep : 1;
    size_t lrows = param_local_rows(p, place, rows), real = param_real_rows(p, place, rows);
    size_t lcols = p->shard == SHARD_ROWS ? cols / (size_t)place->tp : cols;
    size_t k = 0;
    for (size_t l = 0; l < nl; l++) {
        for (size_t e = 0; e < lexp; e++) {
            size_t base = param_full_index(p, place, l, e, 0, 0) - param_full_in_slice(p, place, rows, cols, 0, 0);
            for (size_t r = 0; r < lrows; r++) {
                if (r >= real) {   // padding (tp_vocab_rows): zero in, nothing out
                    if (to_local) { memset(local + k, 0, lcols * sizeof(float)); }
                    k += lcols;
                    continue;
                }
                for (size_t c = 0; c < lcols; c++, k++) {
                    size_t f = base + param_full_in_slice(p, place, rows, cols, r, c);
                    if (to_local) { local[k] = full[f]; } else { full[f] = local[k]; }
                }
            }
        }
    }
}

// The whole table: `full` is laid out as the full table (the checkpoint order), `local` as
// this rank's.
static inline void param_slice(const ParamInfo* full_table, const ParamInfo* local_table, const GPT2Place* place,
                               float* full, float* local, int to_local) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        param_slice_copy(&local_table[i], place, full + full_table[i].offset, local + local_table[i].offset, to_local);
    }
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

// block tensor k (0..16) is table entry 2..13 (the dense blocks' tensors), then 16..20 (MoE)
static inline int block_tensor_index(int k) { return k < 12 ? k + 2 : k + 4; }
// the block tensor of table entry i, or -1 (a root tensor)
static inline int table_block_tensor(int i) { return i >= 2 && i < 14 ? i - 2 : (i >= 16 ? i - 4 : -1); }

static inline floatX** block_tensor(BlockWeights* w, int k) {   // k = 0..16, table entry block_tensor_index(k)
    floatX** ptrs[NUM_BLOCK_TENSORS] = {&w->ln1w, &w->ln1b, &w->qkvw, &w->qkvb, &w->attprojw, &w->attprojb,
                                        &w->ln2w, &w->ln2b, &w->fcw, &w->fcb, &w->fcprojw, &w->fcprojb,
                                        &w->routerw, &w->expfcw, &w->expfcb, &w->expfcprojw, &w->expfcprojb};
    return ptrs[k];
}

// Block l's (global index) weights inside a flat buffer laid out as this rank's table: each
// tensor's slice of the block, NULL where the tensor has none (an MoE block has no fcw, ...).
static inline BlockWeights block_weights_in(floatX* flat, const ParamInfo* table, const GPT2Place* place, int l) {
    BlockWeights w;
    memset(&w, 0, sizeof(w));
    if (flat == NULL) { return w; }   // nothing there (ZeRO-3): the hooks fill the pointers in
    int local = gpt2_place_local(place, l);
    if (local < 0) { die("block %d is not on this pipeline stage", l); }
    for (int k = 0; k < NUM_BLOCK_TENSORS; k++) {
        const ParamInfo* p = &table[block_tensor_index(k)];
        int s = param_local_slice(p, place, local);
        if (s < 0 || p->numel == 0) { continue; }
        *block_tensor(&w, k) = flat + p->offset + (size_t)s * (p->numel / (size_t)p->shape[0]);
    }
    return w;
}
