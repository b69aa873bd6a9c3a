// Model checkpoints in llm.c's format, so GPT-2 weights exported by llm.c's scripts load as
// they are:
//   header: 256 int32 = [20240326, version, maxT, V, L, NH, C, Vp, 0...]
//   then every parameter in the table's order (llmc/model/params.h), version 3 = fp32, 5 = bf16.
// We always write version 3 (fp32); we read 3 and 5. A mixture-of-experts model (llmc/model/moe_block.h)
// has no place in llm.c's format, so it gets a version of its own (doc/expert-parallel.md):
//   version 10 = MoE, fp32: header[8..12] = E, k, N (every N-th block), the capacity factor and
//   the aux coefficient (float32 bits); then the 21 tensors of the table (llmc/model/params.h), the
//   dense MLP's over the dense blocks only. A dense model is always written as version 3. The file is always the whole model: a rank
// that holds a shard (llmc/model/params_shard.h) keeps its slice when loading and is gathered when saving. Saving goes through "<path>.tmp" and a
// rename, so a crash mid-save never leaves a truncated file under the real name.
#pragma once

#include "../common.h"
#include "gpt2.h"

#define CHECKPOINT_MAGIC 20240326
#define CHECKPOINT_VERSION_FP32 3
#define CHECKPOINT_VERSION_BF16 5
#define CHECKPOINT_VERSION_MOE 10

static inline int float_bits(float x) { int b; memcpy(&b, &x, sizeof(b)); return b; }
static inline float bits_float(int b) { float x; memcpy(&x, &b, sizeof(x)); return x; }

// This rank's parameters as the full model (host, fp32, table order): the rank's shard is
// put in place (param_unslice); what other ranks hold is left as it was in `full` (zeros from
// calloc): a sharded run adds the ranks' buffers up over the mesh before saving.
static inline void gpt2_parameters_to_full(GPT2* model, float* full) {
    if (gpt2_place_is_whole(&model->place, &model->config)) {
        copy_floats_to_host(full, model->params_memory, model->num_parameters);
        return;
    }
    float* local = (float*)malloc(model->num_parameters * sizeof(float));
    if (local == NULL) { die("out of host memory for %zu parameters", model->num_parameters); }
    copy_floats_to_host(local, model->params_memory, model->num_parameters);
    param_slice(model->full_info, model->param_info, &model->place, full, local, 0);
    free(local);
}

// The full model (host, fp32, table order) from the shards of n ranks: rank r at places[r]
// holds locals[r] (its flat buffer, fp32). Every element of the model must be held by at least
// one rank; replicated tensors are written by each holder (they are equal).
static inline void gpt2_full_from_shards(const GPT2Config* c, const GPT2Place* places, float* const* locals, int n,
                                         float* full) {
    GPT2Place whole = gpt2_place_whole(c);
    ParamInfo full_info[NUM_PARAMETER_TENSORS], local_info[NUM_PARAMETER_TENSORS];
    fill_param_table(full_info, c, &whole);
    for (int r = 0; r < n; r++) {
        fill_param_table(local_info, c, &places[r]);
        param_slice(full_info, local_info, &places[r], full, locals[r], 0);
    }
}

// Write the full model (host, fp32, table order) as an llm.c checkpoint.
static inline void gpt2_save_full_checkpoint(const GPT2Config* c, const float* full, size_t n, const char* path) {
    int header[256] = {0};
    header[0] = CHECKPOINT_MAGIC;
    header[1] = gpt2_is_moe(c) ? CHECKPOINT_VERSION_MOE : CHECKPOINT_VERSION_FP32;
    header[2] = c->max_seq_len;
    header[3] = c->vocab_size;
    header[4] = c->num_layers;
    header[5] = c->num_heads;
    header[6] = c->channels;
    header[7] = c->padded_vocab_size;
    if (gpt2_is_moe(c)) {
        header[8] = c->num_experts;
        header[9] = c->moe_topk;
        header[10] = c->moe_every;
        header[11] = float_bits(c->moe_capacity);
        header[12] = float_bits(c->moe_aux);
    }
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    fwrite_or_die(header, sizeof(int), 256, f, tmp.c_str());
    fwrite_or_die(full, sizeof(float), n, f, tmp.c_str());
    fclose_and_rename(f, tmp, path);
}

// A rank that holds the whole model writes it (a sharded model: llmc/plan/parallel_plan.h gathers
// the shards with gpt2_parameters_to_full first).
static inline void gpt2_save_checkpoint(GPT2* model, const char* path) {
    if (!gpt2_place_is_whole(&model->place, &model->config)) {
        die("gpt2_save_checkpoint: this rank holds a shard; save through the plan, which gathers the shards");
    }
    float* host = (float*)malloc(model->num_parameters * sizeof(float));
    if (host == NULL) { die("out of host memory saving '%s'", path); }
    gpt2_parameters_to_full(model, host);
    gpt2_save_full_checkpoint(&model->config, host, model->num_parameters, path);
    free(host);
}

// Read only the header: the config of the model stored in a checkpoint.
static inline GPT2Config gpt2_read_checkpoint_config(const char* path, int* version_out) {
    FILE* f = fopen_or_die(path, "rb");
    int header[256];
    fread_or_die(header, sizeof(int), 256, f, path);
    fclose(f);
    if (header[0] != CHECKPOINT_MAGIC) {
        die("'%s' is not a model checkpoint: magic %d, expected %d", path, header[0], CHECKPOINT_MAGIC);
    }
    if (header[1] != CHECKPOINT_VERSION_FP32 && header[1] != CHECKPOINT_VERSION_BF16 && header[1] != CHECKPOINT_VERSION_MOE) {
        die("'%s': checkpoint version %d, expected %d (fp32), %d (bf16) or %d (mixture of experts, fp32)", path, header[1],
            CHECKPOINT_VERSION_FP32, CHECKPOINT_VERSION_BF16, CHECKPOINT_VERSION_MOE);
    }
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 ||
        c.padded_vocab_size < c.vocab_size || c.channels % c.num_heads != 0) {
        die("'%s': invalid model shape in header (maxT %d, V %d, L %d, NH %d, C %d, Vp %d)", path,
            c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels, c.padded_vocab_size);
    }
    if (header[1] == CHECKPOINT_VERSION_MOE) {
        c.num_experts = header[8];
        c.moe_topk = header[9];
        c.moe_every = header[10];
        c.moe_capacity = bits_float(header[11]);
        c.moe_aux = bits_float(header[12]);
        if (c.num_experts < 1 || c.moe_topk < 1 || c.moe_topk > c.num_experts || c.moe_every < 1 ||
            c.moe_every > c.num_layers || !(c.moe_capacity > 0.0f) || !(c.moe_aux >= 0.0f)) {
            die("'%s': invalid mixture of experts in header (E %d, top-k %d, every %d, capacity %g, aux %g)", path,
                c.num_experts, c.moe_topk, c.moe_every, c.moe_capacity, c.moe_aux);
        }
    }
    // The header's shape against the file, before anything is allocated: a header that claims 10^9
    // layers is named here, instead of running out of memory later
    std::string far = gpt2_shape_beyond_limits(&c);
    if (!far.empty()) { die("'%s': header says %s", path, far.c_str()); }
    GPT2Place whole = gpt2_place_whole(&c);
    ParamInfo info[NUM_PARAMETER_TENSORS];
    fill_param_table(info, &c, &whole);
    size_t n = param_table_total(info), elsize = header[1] == CHECKPOINT_VERSION_BF16 ? 2 : 4;
    long need = 256 * 4 + (long)(n * elsize);
    f = fopen_or_die(path, "rb");
    long size = file_size_or_die(f, path);
    fclose(f);
    if (size != need) {
        char moe[96] = "";
        if (gpt2_is_moe(&c)) { snprintf(moe, sizeof(moe), ", %d experts every %d blocks", c.num_experts, c.moe_every); }
        die("'%s': header says L %d, NH %d, C %d, V %d (padded %d), maxT %d%s: %zu parameters of %zu bytes, which need %ld "
            "bytes, but the file has %ld%s", path, c.num_layers, c.num_heads, c.channels, c.vocab_size, c.padded_vocab_size,
            c.max_seq_len, moe, n, elsize, need, size, size < need ? " (truncated)" : "");
    }
    *version_out = header[1];
    return c;
}

// Build the shard of the model described by the checkpoint that a rank at `place` holds (NULL:
// the whole model) and load its weights: the full tensors are read and the shard kept.
// `c` is the config gpt2_read_checkpoint_config read from the file (the caller may change the
// MoE block's routing settings, capacity and aux coefficient, which do not change the tensors).
static inline void gpt2_load_checkpoint_config(GPT2* model, const char* path, const GPT2Place* place, const GPT2Config* cfg,
                                               int version) {
    GPT2Config c = *cfg;
    GPT2Place whole = gpt2_place_whole(&c);
    gpt2_build_shard(model, &c, place ? place : &whole);
    size_t n = model->num_parameters_full;
    FILE* f = fopen_or_die(path, "rb");   // (its size against the header: gpt2_read_checkpoint_config)
    fseek(f, 256 * 4, SEEK_SET);
    float* host = (float*)malloc(n * sizeof(float));
    if (host == NULL) { die("out of host memory loading '%s'", path); }
    if (version != CHECKPOINT_VERSION_BF16) {
        fread_or_die(host, sizeof(float), n, f, path);
    } else {
        // bf16 is the upper 16 bits of an fp32: widen by shifting back
        uint16_t* half = (uint16_t*)malloc(n * sizeof(uint16_t));
        fread_or_die(half, sizeof(uint16_t), n, f, path);
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)half[i] << 16;
            memcpy(&host[i], &bits, sizeof(float));
        }
        free(half);
    }
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(host[i])) { die("'%s' holds a non-finite parameter at index %zu", path, i); }
    }
    gpt2_set_parameters_from_full(model, host);
    free(host);
}
static inline void gpt2_load_checkpoint_shard(GPT2* model, const char* path, const GPT2Place* place) {
    int version;
    GPT2Config c = gpt2_read_checkpoint_config(path, &version);
    gpt2_load_checkpoint_config(model, path, place, &c, version);
}
static inline void gpt2_load_checkpoint(GPT2* model, const char* path) { gpt2_load_checkpoint_shard(model, path, NULL); }
