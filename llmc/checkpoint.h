// Model checkpoints in llm.c's format, so GPT-2 weights exported by llm.c's scripts load as
// they are:
//   header: 256 int32 = [20240326, version, maxT, V, L, NH, C, Vp, 0...]
//   then every parameter in the table's order (llmc/gpt2.h), version 3 = fp32, 5 = bf16.
// We always write version 3 (fp32); we read 3 and 5. Saving goes through "<path>.tmp" and a
// rename, so a crash mid-save never leaves a truncated file under the real name.
#pragma once

#include "common.h"
#include "gpt2.h"

#define CHECKPOINT_MAGIC 20240326
#define CHECKPOINT_VERSION_FP32 3
#define CHECKPOINT_VERSION_BF16 5

static inline void gpt2_save_checkpoint(GPT2* model, const char* path) {
    const GPT2Config* c = &model->config;
    int header[256] = {0};
    header[0] = CHECKPOINT_MAGIC;
    header[1] = CHECKPOINT_VERSION_FP32;
    header[2] = c->max_seq_len;
    header[3] = c->vocab_size;
    header[4] = c->num_layers;
    header[5] = c->num_heads;
    header[6] = c->channels;
    header[7] = c->padded_vocab_size;
    float* host = (float*)malloc(model->num_parameters * sizeof(float));
    if (host == NULL) { die("out of host memory saving '%s'", path); }
    copy_floats_to_host(host, model->params_memory, model->num_parameters);
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    fwrite_or_die(header, sizeof(int), 256, f, tmp.c_str());
    fwrite_or_die(host, sizeof(float), model->num_parameters, f, tmp.c_str());
    fclose_and_rename(f, tmp, path);
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
    if (header[1] != CHECKPOINT_VERSION_FP32 && header[1] != CHECKPOINT_VERSION_BF16) {
        die("'%s': checkpoint version %d, expected %d (fp32) or %d (bf16)", path, header[1],
            CHECKPOINT_VERSION_FP32, CHECKPOINT_VERSION_BF16);
    }
    GPT2Config c;
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
    *version_out = header[1];
    return c;
}

// Build the model described by the checkpoint and load its weights.
static inline void gpt2_load_checkpoint(GPT2* model, const char* path) {
    int version;
    GPT2Config c = gpt2_read_checkpoint_config(path, &version);
    gpt2_build(model, &c);
    size_t n = model->num_parameters;
    size_t elsize = version == CHECKPOINT_VERSION_FP32 ? 4 : 2;
    FILE* f = fopen_or_die(path, "rb");
    long expected = 256 * 4 + (long)(n * elsize);
    long size = file_size_or_die(f, path);
    if (size != expected) {
        die("'%s' has %ld bytes, expected %ld for this model (%zu parameters, %zu bytes each)%s", path, size,
            expected, n, elsize, size < expected ? ": truncated" : "");
    }
    fseek(f, 256 * 4, SEEK_SET);
    float* host = (float*)malloc(n * sizeof(float));
    if (host == NULL) { die("out of host memory loading '%s'", path); }
    if (version == CHECKPOINT_VERSION_FP32) {
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
    copy_floats_to_device(model->params_memory, host, n);
    free(host);
}
