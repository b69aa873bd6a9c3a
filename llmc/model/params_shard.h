// A rank's shard of the parameter table (llmc/model/params.h): which layers, which rows or
// columns of each matrix and which experts this rank holds, and how its shard maps to the full
// tensors of a checkpoint.
//
// A rank holds a shard of the model, described by its place (GPT2Place):
//   tensor parallelism   tp ranks split the matrices; this rank is tp_rank of them
//   pipeline stage       this rank runs layers [layer_begin, layer_end), or with interleaved
//                        stages v chunks of them: [begin + c stride, end + c stride), c < v
//   embedding / head     whether it runs the embedding (first stage) and the head (last stage)
//   expert parallelism   ep ranks split the experts of the MoE blocks; this rank is ep_rank
// One rank with the whole model is {tp 1, layers [0, L), embedding, head, ep 1}: its table is
// params.h's. Every tensor carries a shard rule (Megatron-LM's split, Shoeybi et al. 2019):
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
// The MoE blocks' tensors: routerw replicated (every rank routes), expfcw and expfcb COLUMNS
// inside each expert, expfcprojw ROWS and expfcprojb replicated, as the MLP's; and expert
// parallelism (llmc/parallel/ep.h) splits their expert dimension: rank ep_rank keeps experts
// [ep_rank E/ep, (ep_rank+1) E/ep).
//
// Layered tensors (leading dimension L, one slice per block) keep only the stage's layers; the
// embedding's and the head's tensors exist only on the ranks that run them (numel 0
// elsewhere; wte belongs to both, as the tied LM head). The local shapes, numel and offsets in
// the table follow from the place, so memory, the optimizer and the data-parallel buckets all
// see the local model. Checkpoints are always the full model: param_slice cuts a rank's shard
// out of the full tensor (loading, random init: draw the full tensor, keep the slice) and puts
// it back (saving), so any sharded run reads and writes the one llm.c file.
#pragma once

#include "params.h"
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

// ---------------------------------------------------------------------------------------
// The local table

static inline const char* shard_name(int rule) {
    static const char* names[] = {"replicated", "columns", "heads", "rows", "vocab"};
    return names[rule];
}
// whether block l is in a tensor's set of blocks (LAYERS_*)
static inline int layer_in_set(int set, int every, int l) { return set == LAYERS_ALL || (set == LAYERS_MOE) == moe_block(every, l); }
// the slice of global block l among the blocks of its set (l / N MoE blocks come before block l)
static inline int layer_set_index(int set, int every, int l) {
    if (set == LAYERS_ALL || every == 0) { return l; }
    return set == LAYERS_MOE ? l / every : l - l / every;
}

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

// The table as the rank at `place` holds it: params.h's, each tensor cut to the place's shard,
// the offsets those of this rank's flat buffer.
static inline void fill_param_table(ParamInfo* t, const GPT2Config* cfg, const GPT2Place* place) {
    gpt2_param_table(t, cfg);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        ParamInfo* p = &t[i];
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
    }
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
// A block's weights in this rank's flat buffer

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
