// Autoregressive generation with a KV cache, for both backends (host code: it only calls
// kernels and copy functions, like llmc/model/gpt2.h).
//
// Without a cache, generating token s+1 re-runs the whole forward over tokens 0..s: O(s) work
// per layer and token just to get the one new row of logits. But the keys and values of the
// tokens 0..s-1 never change (causal attention: a token only looks back), so we keep them, per
// layer, in a cache, and each new token only needs its own q, k, v plus attention over the
// cached keys and values: every matmul runs on the new tokens only.
//
// "Flattened tokens" (as continuous batching in inference servers does it): one call of
// gpt2_forward_cached processes N tokens, token j belonging to cache row rows[j] (a sequence)
// at position positions[j]. Every layer except attention treats tokens independently, so the
// N tokens are just N rows of the usual kernels (B = 1, T = N). Attention stores each token's
// k, v at cache[rows[j], positions[j]] and then attends from q_j over cache[rows[j], 0..pos].
// Rule: within a call, a row's tokens have consecutive positions, and the positions before
// them are already cached (earlier calls). That covers
//   prefill: all prompt tokens of all rows at once, prompts of different lengths, no padding
//            (and, for long prompts, split over several calls of at most max_tokens tokens);
//   decode:  one token per active row; finished rows are simply left out.
//
// Memory: the cache holds 2 * L * rows * maxT * C values (k and v of every layer); the scratch
// activations are for max_tokens tokens only (no per-layer copies: nothing is saved for a
// backward), plus max_tokens rows of logits.
// Tensor parallelism: generation runs the model's ops, so with tp ranks every rank of the group
// runs it together (the same tokens, the same random draws): each caches the k, v of its NH/tp
// heads (C/tp channels), computes its Vs columns of the logits, and a row for sampling is
// gathered by the classifier's row_to_host (llmc/parallel/vocab.h). The whole residual stream
// is on every rank (no sequence split here: the ops see Ts = T and use TP's f and g).
#pragma once

#include <vector>
#include "../common.h"
#include "gpt2.h"
#include "sampler.h"

typedef struct {
    int rows, maxT, max_tokens;   // cache rows, positions per row (<= model max_seq_len), tokens per call
    floatX* k;                    // L x (rows, maxT, Ca): keys of every cached token (Ca = C/tp: this rank's heads)
    floatX* v;                    // L x (rows, maxT, Ca): values
    // device scratch for up to max_tokens tokens
    floatX* x;                    // (max_tokens, C) the residual stream
    floatX* ln;                   // (max_tokens, C) layernorm output
    float* ln_mean;               // (max_tokens) layernorm statistics (unused, the kernel writes them)
    float* ln_rstd;               // (max_tokens)
    floatX* qkv;                  // (max_tokens, Cq)   Cq = 3C/tp, Ca = C/tp, H = 4C/tp, Vs = gpt2_local_vocab
    floatX* atty;                 // (max_tokens, Ca) attention output
    floatX* proj;                 // (max_tokens, C) attproj / fcproj output
    floatX* fch;                  // (max_tokens, H)
    floatX* fch_gelu;             // (max_tokens, H)
    floatX* logits;               // (max_tokens, Vs) this rank's logits of the last call's tokens
    float* logits_f;              // (tp Vs) one whole row of logits widened to fp32, for the copy to the host
    int* tokens_d;                // (max_tokens) the last call's tokens, rows, positions
    int* rows_d;
    int* positions_d;
    void* memory;                 // one allocation holding all of the above
    size_t bytes;
} KVCache;

static inline void kvcache_init(KVCache* kv, const GPT2* model, int rows, int maxT, int max_tokens) {
    const GPT2Config* c = &model->config;
    if (rows <= 0 || maxT <= 0 || max_tokens <= 0) {
        die("KV cache sizes must be positive (rows %d, maxT %d, max_tokens %d)", rows, maxT, max_tokens);
    }
    if (maxT > c->max_seq_len) { die("KV cache maxT %d exceeds the model's maximum sequence length %d", maxT, c->max_seq_len); }
    memset(kv, 0, sizeof(*kv));
    kv->rows = rows;
    kv->maxT = maxT;
    kv->max_tokens = max_tokens;
    size_t L = c->num_layers, C = c->channels, Vp = gpt2_run_vocab(model), M = max_tokens;
    // this rank's shares (the whole model on one rank): heads, hidden units, vocabulary columns
    size_t Cq = gpt2_local_qkv(model), Ca = gpt2_local_attn(model), H = gpt2_local_hidden(model), Vs = gpt2_local_vocab(model);
    size_t cache = (size_t)rows * maxT * Ca;
    struct { void** ptr; size_t count; size_t elsize; } tensors[] = {
        {(void**)&kv->k, L * cache, sizeof(floatX)},
        {(void**)&kv->v, L * cache, sizeof(floatX)},
        {(void**)&kv->x, M * C, sizeof(floatX)},
        {(void**)&kv->ln, M * C, sizeof(floatX)},
        {(void**)&kv->ln_mean, M, sizeof(float)},
        {(void**)&kv->ln_rstd, M, sizeof(float)},
        {(void**)&kv->qkv, M * Cq, sizeof(floatX)},
        {(void**)&kv->atty, M * Ca, sizeof(floatX)},
        {(void**)&kv->proj, M * C, sizeof(floatX)},
        {(void**)&kv->fch, M * H, sizeof(floatX)},
        {(void**)&kv->fch_gelu, M * H, sizeof(floatX)},
        {(void**)&kv->logits, M * Vs, sizeof(floatX)},
        {(void**)&kv->logits_f, Vp, sizeof(float)},
        {(void**)&kv->tokens_d, M, sizeof(int)},
        {(void**)&kv->rows_d, M, sizeof(int)},
        {(void**)&kv->positions_d, M, sizeof(int)},
    };
    size_t n = sizeof(tensors) / sizeof(tensors[0]), total = 0;
    for (size_t i = 0; i < n; i++) { total += ceil_div(tensors[i].count * tensors[i].elsize, 64) * 64; }
    kv->memory = device_malloc(total);
    kv->bytes = total;
    char* base = (char*)kv->memory;
    for (size_t i = 0; i < n; i++) {
        *tensors[i].ptr = base;
        base += ceil_div(tensors[i].count * tensors[i].elsize, 64) * 64;   // 64-byte alignment (cuBLASLt likes 16)
    }
}

static inline void kvcache_free(KVCache* kv) {
    if (kv->memory) { device_free(kv->memory); }
    memset(kv, 0, sizeof(*kv));
}

// The attention op of generation (llmc/model/ops.h): store the N tokens' keys and values in the
// cache of the layer in hand, then attend from each query over its row's cached positions.
static inline void op_attention_cached(void* ctx, const OpAt* at, floatX* out, float* state, const floatX* qkv, int C,
                                       int NH) {
    (void)state;
    KVCache* kv = (KVCache*)ctx;
    size_t layer_cache = (size_t)kv->rows * kv->maxT * gpt2_local_attn(at->model);   // one layer's k (or v) cache
    attention_forward_cached(out, qkv, kv->k + at->layer * layer_cache, kv->v + at->layer * layer_cache, kv->rows_d,
                             kv->positions_d, at->T, kv->maxT, C, NH);
}

// Forward of N tokens (host arrays of N: token ids, cache rows, positions) through the model,
// storing their keys and values in the cache and attending over it; the logits of all N
// tokens go to kv->logits (N, Vp). Each block is gpt2_block_compute, the block training runs,
// with the model's ops but attention replaced by op_attention_cached, on one scratch set of
// activations that every layer reuses (nothing is kept for a backward; the residual stream is
// updated in place). Uses model->params_memory, not the placement hooks: under ZeRO-3 the
// caller materialises the full model first.
static inline void gpt2_forward_cached(GPT2* model, KVCache* kv, const int* tokens, const int* rows, const int* positions,
                                       int N) {
    const GPT2Config* cfg = &model->config;
    int L = cfg->num_layers, C = cfg->channels;
    if (N <= 0 || N > kv->max_tokens) { die("gpt2_forward_cached: %d tokens, the cache takes 1 to %d per call", N, kv->max_tokens); }
    if (model->params_memory == NULL) { die("gpt2_forward_cached needs the full parameters (ZeRO-3: materialise them first)"); }
    if (model->place.layer_begin != 0 || model->place.layer_end != L || !model->place.has_embedding || !model->place.has_head) {
        die("gpt2_forward_cached runs every layer: this rank holds a pipeline stage");
    }
    for (int j = 0; j < N; j++) {   // host-side checks: the kernels index with these unchecked
        if (tokens[j] < 0 || tokens[j] >= cfg->vocab_size) { die("gpt2_forward_cached: token %d out of range [0, %d)", tokens[j], cfg->vocab_size); }
        if (rows[j] < 0 || rows[j] >= kv->rows) { die("gpt2_forward_cached: row %d out of range [0, %d)", rows[j], kv->rows); }
        if (positions[j] < 0 || positions[j] >= kv->maxT) {
            die("gpt2_forward_cached: position %d out of range [0, %d)", positions[j], kv->maxT);
        }
    }
    copy_host_to_device(kv->tokens_d, tokens, (size_t)N * sizeof(int));
    copy_host_to_device(kv->rows_d, rows, (size_t)N * sizeof(int));
    copy_host_to_device(kv->positions_d, positions, (size_t)N * sizeof(int));
    ParameterTensors p = model->params;
    GPT2Ops ops = model->ops;
    // the N tokens are the N rows of a B = 1, T = N batch for every kernel but attention
    OpAt outside = {model, -1, -1, 1, N, N};
    ops.embedding.forward(ops.embedding.ctx, &outside, kv->x, kv->tokens_d, kv->positions_d, p.wte, p.wpe, C);
    ops.attention.forward = op_attention_cached;
    ops.attention.backward = NULL;
    ops.attention.ctx = kv;
    BlockActs b;   // x is the block's input, its two residual outputs (in place) and nothing is saved
    b.residual = b.residual2 = b.residual3 = kv->x;
    b.ln1 = b.ln2 = kv->ln;
    b.ln1_mean = b.ln2_mean = kv->ln_mean;
    b.ln1_rstd = b.ln2_rstd = kv->ln_rstd;
    b.qkv = kv->qkv;
    b.atty = kv->atty;
    b.att = NULL;
    b.attproj = b.fcproj = kv->proj;
    b.fch = kv->fch;
    b.fch_gelu = kv->fch_gelu;
    for (int l = 0; l < L; l++) {
        OpAt at = {model, -1, l, 1, N, N};
        BlockWeights w = block_weights_in(model->params_memory, model->param_info, &model->place, l);
        gpt2_block_compute(model, &ops, &at, &w, &b);
    }
    layernorm_forward(kv->ln, kv->ln_mean, kv->ln_rstd, kv->x, p.lnfw, p.lnfb, 1, N, C);
    ops.linear.forward(ops.linear.ctx, &outside, LINEAR_LM_HEAD, kv->logits, kv->ln, p.wte, NULL, C,
                       gpt2_local_vocab(model));   // tied LM head: (N, Vs)
}

// The logits of token j of the last gpt2_forward_cached call, to a host array of gpt2_run_vocab
// floats (the first V are the tokens'; the rest, padding, hold 0).
static inline void kvcache_logits_to_host(GPT2* model, KVCache* kv, int j, float* out) {
    OpAt at = {model, -1, -1, 1, 1, 1};
    model->ops.classifier.row_to_host(model->ops.classifier.ctx, &at, kv->logits, j, gpt2_run_vocab(model),
                                      kv->logits_f, out);
}

typedef struct {
    float temperature;   // <= 0: greedy
    int top_k;           // <= 0: all tokens; 1: greedy
    int max_new;         // at most this many new tokens per row
    int stop_at_newline; // 1: a row also stops after '\n' (token 10)
} GenerateConfig;

// Continues every prompts[r] (r = 0..R-1), R of them in chunks of kv->rows (prompt r of a
// chunk uses cache row r - chunk start). Row r samples from its own rngs[r] (top-k with the
// temperature; greedy draws nothing), so what a row generates does not depend on which other
// rows share its batch: a data-parallel run gives each rank's rows the same completions as a
// single rank does. A row stops after eot, after '\n' when stop_at_newline, after max_new
// tokens, or when prompt + completion reach the cache's maxT (a longer prompt gets nothing);
// completions[r] includes the stop token.
// Prefill: all prompt tokens of the chunk, in calls of at most kv->max_tokens tokens (a prompt
// may be split between calls); then one token per active row per call.
static inline void generate(GPT2* model, KVCache* kv, const std::vector<std::vector<int>>& prompts,
                            const GenerateConfig* gc, Rng* rngs, int eot, std::vector<std::vector<int>>* completions) {
    int R = (int)prompts.size();
    int V = model->config.vocab_size, Vp = gpt2_run_vocab(model);
    completions->assign(R, std::vector<int>());
    std::vector<float> logits(Vp);
    std::vector<int> tokens, rows, positions, owner;   // one call's tokens; owner: the prompt to sample for, or -1
    for (int start = 0; start < R; start += kv->rows) {
        int n = std::min(kv->rows, R - start);
        std::vector<int> active(n, 0);
        // the first call's tokens: every prompt of the chunk that has room to grow
        tokens.clear(); rows.clear(); positions.clear(); owner.clear();
        for (int i = 0; i < n; i++) {
            const std::vector<int>& pr = prompts[start + i];
            if (gc->max_new <= 0 || pr.empty() || (int)pr.size() >= kv->maxT) { continue; }
            active[i] = 1;
            for (int t = 0; t < (int)pr.size(); t++) {
                tokens.push_back(pr[t]);
                rows.push_back(i);
                positions.push_back(t);
                owner.push_back(t + 1 == (int)pr.size() ? start + i : -1);   // the last prompt token predicts
            }
        }
        while (!tokens.empty()) {
            // run the pending tokens in calls of at most max_tokens, sampling as rows' last tokens come out
            for (size_t c0 = 0; c0 < tokens.size(); c0 += kv->max_tokens) {
                int N = (int)std::min(tokens.size() - c0, (size_t)kv->max_tokens);
                gpt2_forward_cached(model, kv, tokens.data() + c0, rows.data() + c0, positions.data() + c0, N);
                for (int j = 0; j < N; j++) {
                    int r = owner[c0 + j];
                    if (r < 0) { continue; }
                    kvcache_logits_to_host(model, kv, j, logits.data());
                    int next = sample_top_k(logits.data(), V, gc->top_k, gc->temperature, &rngs[r]);
                    std::vector<int>& out = (*completions)[r];
                    out.push_back(next);
                    int length = (int)(prompts[r].size() + out.size());
                    if (next == eot || (gc->stop_at_newline && next == '\n') || (int)out.size() >= gc->max_new ||
                        length >= kv->maxT) {
                        active[r - start] = 0;
                    }
                }
            }
            // decode: the newest token of every active row, at the position after the cached ones
            tokens.clear(); rows.clear(); positions.clear(); owner.clear();
            for (int i = 0; i < n; i++) {
                if (!active[i]) { continue; }
                int r = start + i;
                tokens.push_back((*completions)[r].back());
                rows.push_back(i);
                positions.push_back((int)(prompts[r].size() + (*completions)[r].size()) - 1);
                owner.push_back(r);
            }
        }
    }
}
