// Exact-match accuracy on held-out arithmetic: the validation shard of dev/data/arithmetic.py
// holds documents "<eot>482+39=521\n". The prompt is everything up to and including '=', the
// model completes it greedily, and an example counts as correct when the completion is the
// answer followed by a newline (or end-of-text). Needs the byte-level tokenizer (token = byte).
#pragma once

#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../data/token_shards.h"
#include "../model/sampler.h"
#include "../model/generate.h"

typedef struct {
    std::vector<int> prompt;   // eot, digits, operator, digits, '='
    std::vector<int> answer;   // digits (without the newline)
} ArithExample;

// Cut the first shard matching `pattern` into examples; at most max_examples of them.
static inline std::vector<ArithExample> arith_load_examples(const char* pattern, int eot, int max_examples) {
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) { die("no shards match '%s' for the accuracy eval", pattern); }
    FILE* f;
    size_t n = shard_check(g.gl_pathv[0], &f);
    std::vector<uint16_t> tok(n);
    fread_or_die(tok.data(), sizeof(uint16_t), n, f, g.gl_pathv[0]);
    fclose(f);
    std::vector<ArithExample> out;
    for (size_t i = 0; i < n && (int)out.size() < max_examples; i++) {
        if (tok[i] != eot) { continue; }
        // a document: eot, prompt up to '=', answer up to '\n'
        size_t j = i + 1;
        ArithExample ex;
        ex.prompt.push_back(eot);
        while (j < n && tok[j] != '=' && tok[j] != eot && tok[j] != '\n') { ex.prompt.push_back(tok[j++]); }
        if (j >= n || tok[j] != '=') { continue; }
        ex.prompt.push_back('=');
        j++;
        while (j < n && tok[j] != '\n' && tok[j] != eot) { ex.answer.push_back(tok[j++]); }
        if (j >= n || tok[j] != '\n' || ex.answer.empty()) { continue; }
        out.push_back(ex);
    }
    globfree(&g);
    return out;   // empty when the shard holds no "a+b=c" documents
}

// Greedy completion of every prompt: generate() with a KV cache (llmc/model/generate.h), all
// prompts' tokens prefilled at once (different lengths, no padding), then one token per
// unfinished row per step. A row stops after '\n' or end-of-text, after max_new tokens, or
// when prompt + completion reach the model's context (the activations' T when they are
// allocated, else max_seq_len), as the full forward per token did.
static inline void greedy_complete(GPT2* model, const std::vector<std::vector<int>>& prompts, int max_new, int eot,
                            std::vector<std::vector<int>>* completions) {
    int R = (int)prompts.size();
    completions->assign(R, std::vector<int>());
    if (R == 0 || max_new <= 0) { return; }
    int limit = model->max_T > 0 ? model->max_T : model->config.max_seq_len;
    int longest = 0;
    for (const std::vector<int>& p : prompts) { longest = std::max(longest, (int)p.size()); }
    int maxT = std::max(1, std::min(limit, longest + max_new));   // no row can get longer than this
    int rows = std::min(R, 128);
    KVCache kv;
    kvcache_init(&kv, model, rows, maxT, std::min(rows * std::min(longest, maxT), 4096));   // prefill: one call if it fits
    GenerateConfig gc = {0.0f, 1, max_new, 1};   // greedy: the rngs are never drawn from
    std::vector<Rng> rngs(R);
    for (int r = 0; r < R; r++) { rng_init(&rngs[r], (uint64_t)r); }
    generate(model, &kv, prompts, &gc, rngs.data(), eot, completions);
    kvcache_free(&kv);
}

// Returns the fraction of examples answered exactly; prints the first `show` of them.
static inline float arith_accuracy(GPT2* model, const std::vector<ArithExample>& examples, int eot, int show) {
    int correct = 0, shown = 0;
    {
        size_t start = 0, end = examples.size();   // all at once: greedy_complete batches them
        std::vector<std::vector<int>> prompts, completions;
        for (size_t i = start; i < end; i++) { prompts.push_back(examples[i].prompt); }
        greedy_complete(model, prompts, 12, eot, &completions);
        for (size_t i = start; i < end; i++) {
            const std::vector<int>& got = completions[i - start];
            const std::vector<int>& want = examples[i].answer;
            int ok = got.size() == want.size() + 1 && std::equal(want.begin(), want.end(), got.begin()) &&
                     (got.back() == '\n' || got.back() == eot);
            correct += ok;
            if (shown < show) {
                printf("  ");
                for (size_t k = 1; k < examples[i].prompt.size(); k++) { putchar(examples[i].prompt[k]); }
                for (int c : got) { if (c != '\n' && c != eot && c < 128) { putchar(c); } }
                if (ok) { printf("   ok\n"); }
                else {
                    printf("   wrong, want ");
                    for (int c : want) { putchar(c); }
                    printf("\n");
                }
                shown++;
            }
        }
    }
    return (float)correct / (float)examples.size();
}
