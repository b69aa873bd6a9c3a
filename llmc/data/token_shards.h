// Token shards in llm.c's format and a loader that cuts them into (input, target) batches.
//   shard: header 256 int32 = [20240520, 1, num_tokens, 0...], then num_tokens uint16 tokens.
// Targets are the inputs shifted by one token: a sequence reads T+1 consecutive tokens.
//
// Splitting across data-parallel ranks: one "global" micro-batch is nranks*B consecutive
// sequences of T tokens; rank r takes sequences r*B .. r*B+B-1 of it. The union over ranks
// is exactly what a single rank with batch nranks*B reads, so a parallel run sees the same
// data as the single-rank run it is checked against.
#pragma once

#include <glob.h>
#include <string>
#include "../common.h"

#define SHARD_MAGIC 20240520
#define SHARD_HEADER_BYTES (256 * 4)
#define DATALOADER_CHECK_ALL_TOKENS ((size_t)1 << 26)

typedef struct {
    int B, T;              // this rank's micro-batch: B sequences of T tokens
    int rank, nranks;
    int vocab_size;        // every token must be below it
    glob_t files;
    int shard;             // index into files
    size_t pos;            // token index where the current global micro-batch starts
    uint16_t* tokens;      // the current shard
    size_t num_tokens;
    int ahead;             // a shard read and checked ahead (dataloader_look_ahead), or -1
    uint16_t* ahead_tokens;
    size_t ahead_num;
    int* inputs;           // (B, T), host
    int* targets;          // (B, T), host
} DataLoader;

// Open a shard and check its header and size; returns its token count.
static inline size_t shard_check(const char* path, FILE** f_out) {
    FILE* f = fopen_or_die(path, "rb");
    int header[256];
    fread_or_die(header, sizeof(int), 256, f, path);
    if (header[0] != SHARD_MAGIC) { die("'%s' is not a token shard: magic %d, expected %d", path, header[0], SHARD_MAGIC); }
    if (header[1] != 1) { die("'%s': shard version %d, expected 1", path, header[1]); }
    if (header[2] < 0) { die("'%s': negative token count %d in header", path, header[2]); }
    size_t n = (size_t)header[2];
    long size = file_size_or_die(f, path);
    long expected = SHARD_HEADER_BYTES + (long)(2 * n);
    if (size != expected) {
        die("'%s' has %ld bytes, header says %zu tokens = %ld bytes%s", path, size, n, expected,
            size < expected ? ": truncated" : "");
    }
    *f_out = f;
    return n;
}

// Read a shard's tokens (header and size checked) into a new buffer; *bad is the first token
// outside the vocabulary, or n when there is none.
static inline uint16_t* dataloader_read_shard(const DataLoader* dl, int shard, size_t* n_out, size_t* bad) {
    const char* path = dl->files.gl_pathv[shard];
    FILE* f;
    size_t n = shard_check(path, &f);
    if (n < (size_t)dl->nranks * dl->B * dl->T + 1) { die("'%s' shrank to %zu tokens since the run started, fewer than one batch", path, n); }
    uint16_t* tokens = (uint16_t*)malloc(n * sizeof(uint16_t));
    fread_or_die(tokens, sizeof(uint16_t), n, f, path);
    fclose(f);
    for (*bad = 0; *bad < n && tokens[*bad] < dl->vocab_size;) { ++*bad; }
    *n_out = n;
    return tokens;
}

static inline std::string dataloader_bad_token(const DataLoader* dl, int shard, const uint16_t* tokens, size_t i) {
    char msg[1024];
    snprintf(msg, sizeof(msg), "'%s': token %u at position %zu is outside the model's vocabulary of %d", dl->files.gl_pathv[shard],
             tokens[i], i, dl->vocab_size);
    return msg;
}

static inline void dataloader_load_shard(DataLoader* dl, int shard) {
    size_t n, bad;
    uint16_t* tokens;
    if (shard == dl->ahead) {   // read and checked at the step's boundary
        tokens = dl->ahead_tokens, n = bad = dl->ahead_num;
        dl->ahead = -1, dl->ahead_tokens = NULL;
    } else {
        tokens = dataloader_read_shard(dl, shard, &n, &bad);
    }
    if (bad < n) { die("%s", dataloader_bad_token(dl, shard, tokens, bad).c_str()); }
    free(dl->tokens);
    dl->tokens = tokens;
    dl->num_tokens = n;
    dl->shard = shard;
    dl->pos = 0;
}

static inline void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank, int nranks, int vocab_size) {
    memset(dl, 0, sizeof(*dl));
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->nranks = nranks;
    dl->vocab_size = vocab_size;
    dl->ahead = -1;
    if (glob(pattern, 0, NULL, &dl->files) != 0 || dl->files.gl_pathc == 0) {
        die("no token shards match '%s' (the default dataset: python3 dev/data/arithmetic.py)", pattern);
    }
    size_t total = 0, need = (size_t)nranks * B * T + 1;
    for (size_t i = 0; i < dl->files.gl_pathc; i++) {   // check every header and size up front
        FILE* f;
        size_t n = shard_check(dl->files.gl_pathv[i], &f);
        fclose(f);
        if (n < need) {
            die("'%s' has %zu tokens, fewer than one batch needs (%d ranks x %d x %d + 1 = %zu)", dl->files.gl_pathv[i], n,
                nranks, B, T, need);
        }
        total += n;
    }
    dl->inputs = (int*)malloc((size_t)B * T * sizeof(int));
    dl->targets = (int*)malloc((size_t)B * T * sizeof(int));
    // and every token when the data is small (up to 2^26 tokens, 128 MiB: a second's read): a bad
    // token in the last shard is then found before step 1, not when the run reaches it hours later
    if (total <= DATALOADER_CHECK_ALL_TOKENS) {
        for (size_t i = dl->files.gl_pathc; i-- > 1;) { dataloader_load_shard(dl, (int)i); }
    }
    dataloader_load_shard(dl, 0);
}

// Back to the first batch of the first shard (for validation, which always reads the same batches).
static inline void dataloader_reset(DataLoader* dl) {
    if (dl->shard != 0) { dataloader_load_shard(dl, 0); }
    dl->pos = 0;
}

// Fill inputs/targets with this rank's next micro-batch; move to the next shard (wrapping
// around after the last) when the current one has no full global micro-batch left.
static inline void dataloader_next_batch(DataLoader* dl) {
    size_t global = (size_t)dl->nranks * dl->B * dl->T;
    if (dl->pos + global + 1 > dl->num_tokens) {
        int next = (dl->shard + 1) % (int)dl->files.gl_pathc;
        if (next != dl->shard) { dataloader_load_shard(dl, next); }
        dl->pos = 0;
    }
    const uint16_t* src = dl->tokens + dl->pos + (size_t)dl->rank * dl->B * dl->T;
    for (size_t i = 0; i < (size_t)dl->B * dl->T; i++) {
        dl->inputs[i] = src[i];
        dl->targets[i] = src[i + 1];
    }
    dl->pos += global;
}

// Big data (more than 2^26 tokens) is checked as the run reaches it: before a step, the shards
// its n micro-batches would move into (dataloader_next_batch's walk) are read and their tokens
// checked, the first kept for the step. "" when they are good, else what is wrong: the trainer then
// ends the run at the step's boundary, with the training state saved (llmc/train/data_ahead.h).
static inline std::string dataloader_look_ahead(DataLoader* dl, int n) {
    size_t global = (size_t)dl->nranks * dl->B * dl->T, pos = dl->pos, num = dl->num_tokens;
    int shard = dl->shard;
    for (int i = 0; i < n; i++) {
        if (pos + global + 1 > num) {
            int next = (shard + 1) % (int)dl->files.gl_pathc;
            pos = 0;
            if (next == shard) { continue; }
            shard = next;
            if (shard == dl->ahead) { num = dl->ahead_num; continue; }
            size_t bad;
            uint16_t* tokens = dataloader_read_shard(dl, shard, &num, &bad);
            if (bad < num) {
                std::string why = dataloader_bad_token(dl, shard, tokens, bad);
                free(tokens);
                return why;
            }
            if (dl->ahead < 0) { dl->ahead = shard, dl->ahead_tokens = tokens, dl->ahead_num = num; } else { free(tokens); }
        }
        pos += global;
    }
    return "";
}

// Back to a saved position (the training state): shard `shard`, global micro-batch starting at pos.
static inline void dataloader_seek(DataLoader* dl, size_t shard, size_t pos, const char* where) {
    if (shard >= dl->files.gl_pathc) {
        die("'%s': the data position is in shard %zu, but %zu shards match the pattern now", where, shard,
            (size_t)dl->files.gl_pathc);
    }
    if ((int)shard != dl->shard) { dataloader_load_shard(dl, (int)shard); }
    if (pos > dl->num_tokens) {
        die("'%s': the data position %zu is past the %zu tokens of '%s'", where, pos, dl->num_tokens, dl->files.gl_pathv[shard]);
    }
    dl->pos = pos;
}

static inline void dataloader_free(DataLoader* dl) {
    globfree(&dl->files);
    free(dl->tokens);
    free(dl->ahead_tokens);
    free(dl->inputs);
    free(dl->targets);
}
