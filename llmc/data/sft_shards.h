// Supervised fine-tuning (SFT) data: token shards with a loss mask, packed into rows.
//
// Format. An SFT split is an ordinary llm.c token shard `sft_<split>_000000.bin` (magic
// 20240520, uint16 tokens: every tool that reads shards reads it) plus a loss mask beside it,
// `sft_<split>_000000.mask` (the same name with .mask for .bin):
//   header 256 int32 = [20241123 (magic), 1 (version), num_tokens (= the shard's), 0...],
//   then num_tokens uint8 values, each 0 or 1.
// The shard is a sequence of examples, each an EOT token, the prompt, then the answer:
//   tokens  <eot> 1 2 + 3 4 =  4 6 \n
//   mask      0   0 0 0 0 0 0  1 1 1
// mask 1 marks the tokens the model is trained to produce (the answer, here the digits and
// the newline); EOT and the prompt are context only. dev/data/arithmetic.py writes them.
//
// Packing. The examples of all matching files (in sorted file order, split at EOT tokens) are
// packed greedily into rows of T+1 tokens: an example goes into the current row if it fits,
// otherwise the row is closed (its rest padded with EOT, mask 0) and the example starts a new
// one. An example is never split across rows; one longer than T+1 tokens is skipped and
// counted (num_skipped; the trainer prints it). A row then gives inputs = row[0..T-1],
// targets = row[1..T], weights = mask[1..T] (1.0f on answer targets, 0.0f elsewhere). Every
// row starts with an example's EOT (mask 0), so no answer token is lost to the shift.
//
// Rows are not attention-masked per example: a later example in a row attends to the earlier
// ones and its positions continue from them, exactly as pre-training's packed documents do.
// This is acceptable because every example starts with EOT (the model learned in pre-training
// that EOT starts an unrelated document) and the loss is only on answer tokens, each of which
// has its own prompt right before it; what it costs is a little attention to unrelated
// context, while it saves the padding (and the attention-mask kernels) of one example per row.
//
// Data parallelism, as in llmc/data/token_shards.h: a global micro-batch is nranks*B consecutive rows and
// rank r takes rows r*B .. r*B+B-1 of it, so the ranks together read exactly what one rank
// with batch nranks*B reads. When fewer than nranks*B rows are left, the next global
// micro-batch starts again at row 0 (the tail rows are skipped in that pass). Since the loss is
// normalised by the number of answer tokens, which differs from batch to batch and from rank to
// rank, sft_loader_count_ahead() counts them over all ranks' rows without any communication.
#pragma once

#include <glob.h>
#include <algorithm>
#include <vector>
#include <string>
#include "../common.h"
#include "token_shards.h"
#include "../rand.h"

#define SFT_MASK_MAGIC 20241123
#define SFT_MASK_VERSION 1
#define SFT_MASK_HEADER_BYTES (256 * 4)

typedef struct {
    std::vector<int> prompt;   // starts with EOT; the mask-0 tokens
    std::vector<int> answer;   // the mask-1 tokens (including the trailing newline)
} SFTExample;

// The mask file of a shard: "x.bin" -> "x.mask".
static inline std::string sft_mask_path(const char* shard_path) {
    std::string p(shard_path);
    if (p.size() < 4 || p.compare(p.size() - 4, 4, ".bin") != 0) {
        die("'%s': an SFT shard's name must end in .bin (its loss mask is the same name with .mask)", shard_path);
    }
    return p.substr(0, p.size() - 4) + ".mask";
}

// Read one SFT shard and its mask and check them (see the header comment); dies naming the
// file on any problem. vocab_size 0 skips the vocabulary check.
static inline void sft_read_file(const char* path, int vocab_size, int eot, std::vector<uint16_t>* tokens,
                                 std::vector<uint8_t>* mask) {
    FILE* f;
    size_t n = shard_check(path, &f);
    tokens->resize(n);
    fread_or_die(tokens->data(), sizeof(uint16_t), n, f, path);
    fclose(f);
    std::string mpath = sft_mask_path(path);
    const char* mp = mpath.c_str();
    check_regular_file_or_die(mp);
    FILE* mf = fopen(mp, "rb");
    if (mf == NULL) { die("SFT loss mask '%s' for shard '%s' is missing: %s", mp, path, strerror(errno)); }
    long size = file_size_or_die(mf, mp);
    if (size < SFT_MASK_HEADER_BYTES) { die("'%s' is truncated: %ld bytes, shorter than the 1024-byte mask header", mp, size); }
    int header[256];
    fread_or_die(header, sizeof(int), 256, mf, mp);
    if (header[0] != SFT_MASK_MAGIC) { die("'%s' is not an SFT loss mask: magic %d, expected %d", mp, header[0], SFT_MASK_MAGIC); }
    if (header[1] != SFT_MASK_VERSION) { die("'%s': mask version %d, expected %d", mp, header[1], SFT_MASK_VERSION); }
    if (header[2] < 0 || (size_t)header[2] != n) {
        die("'%s' holds %d mask values but its shard '%s' holds %zu tokens", mp, header[2], path, n);
    }
    long expected = SFT_MASK_HEADER_BYTES + (long)n;
    if (size != expected) {
        die("'%s' has %ld bytes, header says %zu values = %ld bytes%s", mp, size, n, expected,
            size < expected ? ": truncated" : "");
    }
    mask->resize(n);
    fread_or_die(mask->data(), 1, n, mf, mp);
    fclose(mf);
    if (n == 0) { die("no SFT examples in '%s': the shard is empty", path); }
    if ((*tokens)[0] != eot) { die("'%s': the shard starts with token %u, not EOT (%d): tokens before the first example", path, (*tokens)[0], eot); }
    for (size_t i = 0; i < n; i++) {
        unsigned t = (*tokens)[i], m = (*mask)[i];
        if (vocab_size > 0 && t >= (unsigned)vocab_size) {
            die("'%s': token %u at position %zu is outside the model's vocabulary of %d", path, t, i, vocab_size);
        }
        if (m > 1) { die("'%s': mask value %u at position %zu, expected 0 or 1", mp, m, i); }
        if (m == 1 && t == (unsigned)eot) { die("'%s': mask 1 on the EOT token at position %zu (EOT starts an example, it is never an answer)", mp, i); }
    }
    // the loss is on answer tokens only: a mask without one would train (or validate) on nothing, without a word
    if (memchr(mask->data(), 1, n) == NULL) { die("'%s' marks no answer token (no mask 1 in %zu): SFT would learn nothing from '%s'", mp, n, path); }
}

static inline void sft_glob_or_die(const char* pattern, glob_t* g) {
    if (glob(pattern, 0, NULL, g) != 0 || g->gl_pathc == 0) {
        die("no SFT shards match '%s' (the default SFT data: python3 dev/data/arithmetic.py)", pattern);
    }
}

// All (prompt, answer) examples of the shards matching pattern, in file order; at most
// max_examples of them (0 = all). Used by RLVR as prompts and the verifier's answers. Each
// example must be EOT, prompt (mask 0), answer (mask 1, at least one token), nothing after.
static inline std::vector<SFTExample> sft_load_examples(const char* pattern, int eot, int max_examples) {
    glob_t g;
    sft_glob_or_die(pattern, &g);
    std::vector<SFTExample> out;
    std::vector<uint16_t> tok;
    std::vector<uint8_t> mask;
    for (size_t fi = 0; fi < g.gl_pathc && (max_examples <= 0 || (int)out.size() < max_examples); fi++) {
        const char* path = g.gl_pathv[fi];
        sft_read_file(path, 0, eot, &tok, &mask);
        size_t n = tok.size();
        for (size_t i = 0; i < n && (max_examples <= 0 || (int)out.size() < max_examples);) {
            size_t end = i + 1;   // the example is tok[i..end-1]; tok[i] is EOT
            while (end < n && tok[end] != eot) { end++; }
            SFTExample ex;
            for (size_t j = i; j < end; j++) {
                if (mask[j]) {
                    ex.answer.push_back(tok[j]);
                } else if (ex.answer.empty()) {
                    ex.prompt.push_back(tok[j]);
                } else {
                    die("'%s': the example at token %zu has a prompt token (mask 0) after its answer at position %zu", path, i, j);
                }
            }
            if (ex.answer.empty()) { die("'%s': the example at token %zu has no answer (no mask-1 token)", path, i); }
            out.push_back(ex);
            i = end;
        }
    }
    globfree(&g);
    return out;
}

typedef struct {
    int B, T, rank, nranks;
    int* inputs;                 // this rank's (B, T) micro-batch, host
    int* targets;
    float* weights;              // 1.0f where the target is an answer token, else 0.0f
    long num_examples;           // examples packed
    long num_skipped;            // examples skipped as longer than T+1 tokens
    long num_rows;               // packed rows
    // packed rows: row r is rows[r*(T+1) .. r*(T+1)+T] and its mask row_mask[...]
    uint16_t* rows;
    uint8_t* row_mask;
    int* row_answers;            // answer tokens among row r's targets: sum of row_mask[1..T]
    long next_row;               // first row of the next global micro-batch
    int eot;
} SFTLoader;

static inline void sft_loader_init(SFTLoader* dl, const char* pattern, int B, int T, int rank, int nranks,
                                   int vocab_size, int eot) {
    memset(dl, 0, sizeof(*dl));
    if (B < 1 || T < 1 || nranks < 1 || rank < 0 || rank >= nranks) {
        die("SFT loader: bad batch %d x %d for rank %d of %d", B, T, rank, nranks);
    }
    dl->B = B; dl->T = T; dl->rank = rank; dl->nranks = nranks; dl->eot = eot;
    glob_t g;
    sft_glob_or_die(pattern, &g);
    const size_t W = (size_t)T + 1;
    std::vector<uint16_t> rows, tok;
    std::vector<uint8_t> rmask, mask;
    size_t fill = 0;   // tokens in the current (last) row; 0 = no open row
    auto close_row = [&]() {
        for (; fill < W && fill > 0; fill++) { rows.push_back((uint16_t)eot); rmask.push_back(0); }
        fill = 0;
    };
    for (size_t fi = 0; fi < g.gl_pathc; fi++) {
        sft_read_file(g.gl_pathv[fi], vocab_size, eot, &tok, &mask);
        size_t n = tok.size();
        for (size_t i = 0; i < n;) {
            size_t end = i + 1;
            while (end < n && tok[end] != eot) { end++; }
            size_t len = end - i;
            if (len > W) {
                dl->num_skipped++;
            } else {
                if (fill + len > W) { close_row(); }
                rows.insert(rows.end(), tok.begin() + i, tok.begin() + end);
                rmask.insert(rmask.end(), mask.begin() + i, mask.begin() + end);
                fill += len;
                if (fill == W) { fill = 0; }   // exactly full: closed, nothing to pad
                dl->num_examples++;
            }
            i = end;
        }
    }
    close_row();
    if (dl->num_examples == 0) {
        die("every SFT example in '%s' is longer than T+1 = %zu tokens (%ld skipped): raise --seq", pattern, W,
            dl->num_skipped);
    }
    dl->num_rows = (long)(rows.size() / W);
    long need = (long)nranks * B;
    if (dl->num_rows < need) {
        die("'%s' packs into %ld rows of T+1 = %zu tokens, fewer than one global micro-batch needs (%d ranks x %d rows)",
            pattern, dl->num_rows, W, nranks, B);
    }
    globfree(&g);
    dl->rows = (uint16_t*)malloc(rows.size() * sizeof(uint16_t));
    dl->row_mask = (uint8_t*)malloc(rmask.size());
    dl->row_answers = (int*)malloc((size_t)dl->num_rows * sizeof(int));
    memcpy(dl->rows, rows.data(), rows.size() * sizeof(uint16_t));
    memcpy(dl->row_mask, rmask.data(), rmask.size());
    for (long r = 0; r < dl->num_rows; r++) {
        int c = 0;
        for (size_t t = 1; t < W; t++) { c += dl->row_mask[(size_t)r * W + t]; }
        dl->row_answers[r] = c;
    }
    dl->inputs = (int*)malloc((size_t)B * T * sizeof(int));
    dl->targets = (int*)malloc((size_t)B * T * sizeof(int));
    dl->weights = (float*)malloc((size_t)B * T * sizeof(float));
    dl->next_row = 0;
}

// The first row of the global micro-batch that starts at `row` (row 0 when too few are left).
static inline long sft_batch_start(const SFTLoader* dl, long row) {
    long global = (long)dl->nranks * dl->B;
    return row + global > dl->num_rows ? 0 : row;
}

// Fill inputs/targets/weights with this rank's next micro-batch.
static inline void sft_loader_next_batch(SFTLoader* dl) {
    const size_t W = (size_t)dl->T + 1;
    long start = sft_batch_start(dl, dl->next_row);
    for (int b = 0; b < dl->B; b++) {
        long r = start + (long)dl->rank * dl->B + b;
        const uint16_t* row = dl->rows + (size_t)r * W;
        const uint8_t* m = dl->row_mask + (size_t)r * W;
        for (int t = 0; t < dl->T; t++) {
            size_t i = (size_t)b * dl->T + t;
            dl->inputs[i] = row[t];
            dl->targets[i] = row[t + 1];
            dl->weights[i] = m[t + 1] ? 1.0f : 0.0f;
        }
    }
    dl->next_row = start + (long)dl->nranks * dl->B;
}

// Answer tokens (weight-1 targets) in the next `micro_batches` global micro-batches, all
// ranks' rows together, without advancing. The trainer divides the summed loss by it, so every
// rank uses the same normaliser and a data-parallel run equals the single-rank one.
static inline long sft_loader_count_ahead(const SFTLoader* dl, int micro_batches) {
    long global = (long)dl->nranks * dl->B;
    long row = dl->next_row, count = 0;
    for (int k = 0; k < micro_batches; k++) {
        long start = sft_batch_start(dl, row);
        for (long r = start; r < start + global; r++) { count += dl->row_answers[r]; }
        row = start + global;
    }
    return count;
}

// Put the packed rows in a random order (Fisher-Yates, seeded): without it SFT reads the
// examples in file order, so two runs from the same checkpoint are identical whatever --seed
// says. The order is drawn once and kept for every pass over the data. Every rank draws the same
// permutation from the same seed, so data parallelism still splits the same global rows.
static inline void sft_loader_shuffle(SFTLoader* dl, uint64_t seed) {
    const size_t W = (size_t)dl->T + 1;
    Rng rng;
    rng_init(&rng, seed);
    for (long i = dl->num_rows - 1; i > 0; i--) {
        uint64_t hi = rng_u32(&rng), lo = rng_u32(&rng);   // two statements: a fixed draw order
        long j = (long)(((hi << 32) | lo) % (uint64_t)(i + 1));
        std::swap_ranges(dl->rows + i * W, dl->rows + (i + 1) * W, dl->rows + j * W);
        std::swap_ranges(dl->row_mask + i * W, dl->row_mask + (i + 1) * W, dl->row_mask + j * W);
        std::swap(dl->row_answers[i], dl->row_answers[j]);
    }
}

// Back to the first micro-batch (for validation, which always reads the same batches).
static inline void sft_loader_reset(SFTLoader* dl) { dl->next_row = 0; }

static inline void sft_loader_free(SFTLoader* dl) {
    free(dl->rows);
    free(dl->row_mask);
    free(dl->row_answers);
    free(dl->inputs);
    free(dl->targets);
    free(dl->weights);
    memset(dl, 0, sizeof(*dl));
}
