// Optimizer training state, so that a run can stop and continue bit-exactly: AdamW's step
// count and moments m and v, and the fp32 master weights when the backend keeps them (the
// bf16 build). The parameters themselves go in the model checkpoint (llmc/model/checkpoint.h);
// resuming = gpt2_load_checkpoint + gpt2_load_state.
//   header: 256 int32 = [20241201, version 1, step, has_master, 0..., then at slots 8..11 the
//           two size_t opt_offset and opt_count]
//   then m, v (opt_count floats each), then the master weights (opt_count floats) if has_master.
// Host code for both backends: the arrays move only through copy_* calls. Written to
// "<path>.tmp" and renamed when complete.
#pragma once

#include "../llmc/common.h"
#include "../llmc/model/gpt2.h"

#define STATE_MAGIC 20241201
#define STATE_VERSION 1

static inline void gpt2_save_state(const GPT2* model, const char* path) {
    if (model->m_memory == NULL) { die("cannot save the optimizer state to '%s': no update has run yet", path); }
    int header[256] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = model->step;
    header[3] = model->master_memory != NULL;
    size_t span[2] = {model->opt_offset, model->opt_count};
    memcpy(&header[8], span, sizeof(span));
    size_t n = model->opt_count;
    float* host = (float*)malloc(n * sizeof(float));
    if (host == NULL) { die("out of host memory saving '%s'", path); }
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    fwrite_or_die(header, sizeof(int), 256, f, tmp.c_str());
    const float* arrays[3] = {model->m_memory, model->v_memory, model->master_memory};
    for (int a = 0; a < 3; a++) {
        if (arrays[a] == NULL) { continue; }
        copy_device_to_host(host, arrays[a], n * sizeof(float));
        fwrite_or_die(host, sizeof(float), n, f, tmp.c_str());
    }
    fclose_and_rename(f, tmp, path);
    free(host);
}

// Load into a model built with the same shape (e.g. by gpt2_load_checkpoint). Allocates the
// optimizer arrays when the model has none yet.
static inline void gpt2_load_state(GPT2* model, const char* path) {
    FILE* f = fopen_or_die(path, "rb");
    int header[256];
    fread_or_die(header, sizeof(int), 256, f, path);
    if (header[0] != STATE_MAGIC) { die("'%s' is not an optimizer state file: magic %d, expected %d", path, header[0], STATE_MAGIC); }
    if (header[1] != STATE_VERSION) { die("'%s': state version %d, expected %d", path, header[1], STATE_VERSION); }
    int step = header[2], has_master = header[3];
    size_t span[2];
    memcpy(span, &header[8], sizeof(span));
    size_t offset = span[0], n = span[1];
    if (step < 0 || (has_master != 0 && has_master != 1) || offset + n > model->num_parameters || n == 0) {
        die("'%s': invalid header (step %d, master %d, parameters [%zu, %zu) of a model with %zu)", path, step,
            has_master, offset, offset + n, model->num_parameters);
    }
    if (model->m_memory && (model->opt_offset != offset || model->opt_count != n)) {
        die("'%s' holds the state of parameters [%zu, %zu), this model updates [%zu, %zu)", path, offset, offset + n,
            model->opt_offset, model->opt_offset + model->opt_count);
    }
    long expected = 256 * 4 + (long)((2 + has_master) * n * sizeof(float));
    long size = file_size_or_die(f, path);
    if (size != expected) {
        die("'%s' has %ld bytes, expected %ld for %zu parameters%s%s", path, size, expected, n,
            has_master ? " with master weights" : "", size < expected ? ": truncated" : "");
    }
    size_t bytes = n * sizeof(float);
    if (model->m_memory == NULL) {
        model->opt_offset = offset;
        model->opt_count = n;
        model->m_memory = (float*)device_malloc(bytes);
        model->v_memory = (float*)device_malloc(bytes);
    }
    if (BACKEND_MASTER_WEIGHTS && model->master_memory == NULL) { model->master_memory = (float*)device_malloc(bytes); }
    float* host = (float*)malloc(bytes);
    if (host == NULL) { die("out of host memory loading '%s'", path); }
    fread_or_die(host, sizeof(float), n, f, path);
    copy_host_to_device(model->m_memory, host, bytes);
    fread_or_die(host, sizeof(float), n, f, path);
    copy_host_to_device(model->v_memory, host, bytes);
    if (has_master) {
        fread_or_die(host, sizeof(float), n, f, path);
        if (model->master_memory) {
            copy_host_to_device(model->master_memory, host, bytes);
        } else {
            // a bf16 run's state into an fp32 backend: the master weights are the true parameters
            copy_floats_to_device(model->params_memory + offset, host, n);
        }
    } else if (model->master_memory) {
        // an fp32 run's state into a bf16 backend: seed the master weights from the parameters
        convert_floatX_to_float(model->master_memory, model->params_memory + offset, n);
    }
    fclose(f);
    free(host);
    model->step = step;
}
