// GPT-2's types: the activations one micro-batch slot saves (ActivationTensors, BlockActs), the
// gradient scratch, the model (GPT2), this rank's shard sizes, and the declarations of the pieces
// defined beside llmc/model/gpt2.h. The files of the model's parts (gpt2_build.h, recompute.h,
// zero_bubble_backward.h, gpt2_accounting.h, moe_block.h) include this one, and llmc/model/gpt2.h
// includes them all: include gpt2.h to use the model.
#pragma once

#include <string.h>
#include "../common.h"
#include "../backend.h"
#include "params_shard.h"
#include "ops.h"
#include "hooks.h"

// ---------------------------------------------------------------------------------------
// Activations saved by the forward for the backward, one set per slot ("L x": one per layer of
// the slot, the stage's layers or, interleaved, one chunk's). Sizes are local: Cq = 3C/tp,
// Ca = C/tp, H = 4C/tp; the residual stream's tensors hold Ts tokens per sequence (T, or T/tp
// under sequence parallelism: llmc/model/ops.h).

#define GPT2_MAX_SLOTS 64

typedef struct {
    floatX* encoded;    // (B, Ts, C)       the slot's input: the embedding (or what the previous stage sent)
    floatX* ln1;        // L x (B, Ts, C)
    float *ln1_mean, *ln1_rstd;   // L x (B, Ts)   layernorm statistics stay fp32 in every backend
    floatX* qkv;        // L x (B, T, Cq)
    floatX* atty;       // L x (B, T, Ca)  attention output, before the projection
    float* att;         // L x attention_state_size(B, T, NH/tp)
    floatX* attproj;    // L x (B, Ts, C)
    floatX* residual2;  // L x (B, Ts, C)   x after the attention half of the block
    floatX* ln2;        // L x (B, Ts, C)
    float *ln2_mean, *ln2_rstd;   // L x (B, Ts)
    floatX* fch;        // L x (B, T, H)   fc output, before GELU
    floatX* fch_gelu;   // L x (B, T, H)
    floatX* fcproj;     // L x (B, Ts, C)
    floatX* residual3;  // L x (B, Ts, C)   x after the whole block
    floatX* lnf;        // (B, Ts, C)
    float *lnf_mean, *lnf_rstd;   // (B, Ts)
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
    GPT2Place place;                              // this rank's shard (llmc/model/params_shard.h)
    ParamInfo param_info[NUM_PARAMETER_TENSORS];  // local shapes and offsets
    ParamInfo full_info[NUM_PARAMETER_TENSORS];   // the whole model's (the checkpoint's layout)
    size_t num_parameters;                        // local
    size_t num_parameters_full;
    floatX *params_memory, *grads_memory;         // the flat buffers (llmc/model/params.h)
    ParameterTensors params, grads;               // the tensors in them
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
    int recompute;              // --recompute (llmc/model/recompute.h): 0 (none) keeps every activation per layer
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
    struct MoE* moe;            // mixture of experts (llmc/model/moe_block.h): routing state and buffers, NULL when dense
} GPT2;

// ---------------------------------------------------------------------------------------
// Sizes: this rank's shard of a block, of the vocabulary, of the layers
static inline int gpt2_local_heads(const GPT2* m) { return m->config.num_heads / m->place.tp; }
static inline int gpt2_local_qkv(const GPT2* m) { return 3 * m->config.channels / m->place.tp; }
static inline int gpt2_local_attn(const GPT2* m) { return m->config.channels / m->place.tp; }
static inline int gpt2_local_hidden(const GPT2* m) { return 4 * m->config.channels / m->place.tp; }
static inline int gpt2_local_vocab(const GPT2* m) { return tp_vocab_rows(m->config.padded_vocab_size, m->place.tp); }
// the width of a whole row of logits, tp x the local vocabulary: Vp, or more where tp does not
// divide Vp (the shards pad it further: params_shard.h's tp_vocab_rows)
static inline int gpt2_run_vocab(const GPT2* m) { return tp_padded_vocab(m->config.padded_vocab_size, m->place.tp); }
static inline int gpt2_local_layers(const GPT2* m) { return gpt2_place_num_layers(&m->place); }
// layers one activation slot holds: one chunk's (all the stage's without interleaving)
static inline int gpt2_slot_layers(const GPT2* m) { return gpt2_place_chunk_layers(&m->place); }

// Defined beside llmc/model/gpt2.h: where block l's activations are in a slot (and the slot's output) and AdamW's
// state, in gpt2_build.h; what a block's backward rebuilds first with --recompute (recompute.h).
static inline BlockActs gpt2_block_acts(GPT2* model, int slot, int l);
static inline floatX* gpt2_stage_output(GPT2* model, int slot);
static inline void gpt2_allocate_optimizer(GPT2* model);
static inline void gpt2_block_recompute(GPT2* model, const OpAt* at, const BlockWeights* w, BlockActs* b);
// the block's attention half (gpt2.h), which recomputation runs again (recompute.h)
static inline void gpt2_block_compute_attention(GPT2* model, const GPT2Ops* ops, const OpAt* at, const BlockWeights* w,
                                                BlockActs* b);
// the MLP's default entries (gpt2.h), which building the model installs (gpt2_build.h)
static inline void op_mlp_forward(void* ctx, const OpAt* at, MLPActs* a, const floatX* inp, const BlockWeights* w,
                                  int C, int H);
static inline void op_mlp_backward(void* ctx, const OpAt* at, floatX* dinp, const floatX* dout, const MLPActs* a,
                                   const floatX* inp, const BlockWeights* w, BlockWeights* g, floatX* dh, int C, int H);

static inline OpAt gpt2_at(GPT2* model, int slot, int layer) {
    const ActivationTensors* a = &model->acts[slot];
    OpAt at = {model, slot, layer, a->B, a->T, a->Ts};
    return at;
}

// The floats the attention op saves per layer for its backward (its own count, or the kernel's)
static inline size_t gpt2_attention_state_size(const GPT2* model, int B, int T) {
    const GPT2Ops* o = &model->ops;
    int NH = gpt2_local_heads(model);
    if (o->attention.state_size) { return o->attention.state_size(o->attention.ctx, B, T, (int)gpt2_local_attn(model), NH); }
    return attention_state_size(B, T, NH);
}
