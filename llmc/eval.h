// Exact-match accuracy on held-out arithmetic: the validation shard of dev/data/arithmetic.py
// holds documents "<eot>482+39=521\n". The prompt is everything up to and including '=', the
// model completes it greedily, and an example counts as correct when the completion is the
// answer followed by a newline (or end-of-text). Needs the byte-level tokenizer (token = byte).
#pragma once

#include <vector>
#include "common.h"
#include "gpt2.h"
#include "data.h"
#include "sampler.h"

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

// Greedy completion of up to model->max_B prompts at once. The prompts have different
// lengths; each row is padded after its end, which causal attention never looks at, and the
// next token of a row is read from the logits at that row's last real position.
static inline void greedy_complete(GPT2* model, const std::vector<std::vector<int>>& prompts, int max_new, int eot,
                            std::vector<std::vector<int>>* completions) {
    int rows = (int)prompts.size();
    int V = model->config.vocab_size, Vp = model->config.padded_vocab_size;
    std::vector<std::vector<int>> ctx = prompts;
    std::vector<int> done(rows, 0);
    completions->assign(rows, std::vector<int>());
    std::vector<float> logits(Vp);
    for (int step = 0; step < max_new; step++) {
        int T = 0, active = 0;
        for (int r = 0; r < rows; r++) {
            if (!done[r] && (int)ctx[r].size() >= model->max_T) { done[r] = 1; }   // no room left
            if (!done[r]) { active++; T = std::max(T, (int)ctx[r].size()); }
        }
        if (active == 0) { break; }
        std::vector<int> tokens((size_t)rows * T, eot);
        for (int r = 0; r < rows; r++) {
            for (int t = 0; t < (int)ctx[r].size() && t < T; t++) { tokens[(size_t)r * T + t] = ctx[r][t]; }
        }
        gpt2_forward(model, tokens.data(), rows, T);
        for (int r = 0; r < rows; r++) {
            if (done[r]) { continue; }
            gpt2_logits_to_host(model, r, (int)ctx[r].size() - 1, logits.data());
            int next = sample_argmax(logits.data(), V);
            ctx[r].push_back(next);
            (*completions)[r].push_back(next);
            if (next == '\n' || next == eot) { done[r] = 1; }
        }
    }
}

// Returns the fraction of examples answered exactly; prints the first `show` of them.
static inline float arith_accuracy(GPT2* model, const std::vector<ArithExample>& examples, int eot, int show) {
    int correct = 0, shown = 0;
    for (size_t start = 0; start < examples.size(); start += model->max_B) {
        size_t end = std::min(examples.size(), start + (size_t)model->max_B);
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
