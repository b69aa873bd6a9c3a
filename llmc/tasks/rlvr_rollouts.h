// RL with verifiable rewards (RLVR): the lecture's third training task.
//   forward: [X] -> model -> [Y_log] -> sampled Y    (tokens generated one by one, llmc/model/generate.h)
//   reward:  r = R(Y, Y_true)                         (a verifier: a C++ function, below)
//   loss:    -A(r) * log p(Y)                         (the policy gradient, REINFORCE)
// One RL step: take P prompts, sample G completions of each (a "group"), score each with the
// reward function, turn the rewards into advantages, and take one gradient step on
//   J = 1/N * sum_i sum_{t in Y_i} [ -A_i * log p(y_t) + beta * k3_t ]
// where N is the number of completion tokens in the whole step (all prompts, all ranks) and
//   k3_t = exp(l_t) - l_t - 1,  l_t = log p_ref(y_t) - log p(y_t)
// is the per-token estimate of KL(p || p_ref) against a frozen reference copy of the starting
// model (GRPO's choice: always >= 0, unbiased). Both terms are a weighted cross-entropy on the
// completion tokens, since CE_t = -log p(y_t), so the fused classifier computes the gradient:
//   d/dtheta [-A log p]     = A * dCE/dtheta
//   d/dtheta [beta * k3_t]  = beta * (1 - exp(l_t)) * dlog p/dtheta = beta * (exp(l_t) - 1) * dCE/dtheta
//   => loss weight w_t = A_i + beta * (p_ref(y_t) / p(y_t) - 1), and dloss = 1/N.
// The weights use log p(y_t) of the current parameters, which is what the sampling policy
// produced (one update per rollout: on-policy), computed by one extra forward pass.
//
// Advantages (--rl-mode):
//   grpo     A_i = (r_i - mean(group)) / (std(group) + 1e-4): within one prompt's G samples, so
//            the model is pushed towards its better answers to THIS prompt. A group whose
//            samples all scored the same carries no signal: A = 0 (no NaN: the std is 0,
//            the numerator is exactly 0).
//   baseline A_i = r_i - b, b a running mean of the batch mean reward (b <- 0.9 b + 0.1 mean,
//            started at the first step's mean): the classic REINFORCE baseline.
//   top1     the lecture's simplest form: one greedy (top-1) sample per prompt and A_i = r_i,
//            i.e. loss = -r * log p(top_1(Y_log)).
// Data parallelism: rank k generates rows [k R, (k+1) R) of the P*G rollouts (R = P*G/ndp)
// with per-row random streams, so a row's sample does not depend on which rank draws it; the
// rewards and lengths are all-gathered, so every rank computes the same global group
// statistics and N (see train_gpt2.cu), and the run equals the single-rank one.
#pragma once

#include <vector>
#include <string>
#include <math.h>
#include "../common.h"
#include "../model/gpt2.h"
#include "../model/generate.h"
#include "../data/sft_shards.h"

// ---- reward functions: R(completion, answer). The completion includes its stop token ('\n'
// or end-of-text, if it stopped); the answer is the reference completion, ending in '\n'.
typedef float (*RewardFn)(const std::vector<int>& completion, const std::vector<int>& answer, int eot);

// 1 when the completion is exactly the answer (its digits, then a newline or end-of-text).
static inline float reward_exact_match(const std::vector<int>& completion, const std::vector<int>& answer, int eot) {
    if (completion.size() != answer.size() || answer.empty()) { return 0.0f; }
    for (size_t i = 0; i + 1 < answer.size(); i++) { if (completion[i] != answer[i]) { return 0.0f; } }
    int last = completion.back();
    return (last == answer.back() || last == eot) ? 1.0f : 0.0f;
}

// 1 when the completion is well-formed: 1 to 8 digits (an optional leading '-'), then a
// newline. Says nothing about being right: an example of a second, "shaping" reward.
static inline float reward_format(const std::vector<int>& completion, const std::vector<int>& answer, int eot) {
    (void)answer; (void)eot;
    size_t n = completion.size(), i = 0;
    if (n < 2 || completion[n - 1] != '\n') { return 0.0f; }
    if (completion[0] == '-') { i = 1; }
    size_t digits = n - 1 - i;
    if (digits < 1 || digits > 8) { return 0.0f; }
    for (; i + 1 < n; i++) { if (completion[i] < '0' || completion[i] > '9') { return 0.0f; } }
    return 1.0f;
}

typedef struct {
    const char* name;
    RewardFn fn;
    const char* what;
} RewardSpec;

static const RewardSpec REWARDS[] = {
    {"exact", reward_exact_match, "1 if the completion is exactly the answer, else 0"},
    {"format", reward_format, "1 if the completion is a number followed by a newline, else 0"},
};

// The reward of a run: the sum of the named functions ("exact", "format", "exact+format").
typedef struct {
    std::vector<RewardFn> fns;
    std::string name;
} Reward;

static inline Reward reward_parse(const char* spec) {
    Reward r;
    r.name = spec;
    std::string s(spec);
    size_t start = 0;
    while (start <= s.size()) {
        size_t end = s.find('+', start);
        if (end == std::string::npos) { end = s.size(); }
        std::string part = s.substr(start, end - start);
        int found = 0;
        for (const RewardSpec& spec_i : REWARDS) {
            if (part == spec_i.name) { r.fns.push_back(spec_i.fn); found = 1; }
        }
        if (!found) { die("--reward: unknown reward function '%s' in '%s' (have: exact, format, or a sum such as exact+format)", part.c_str(), spec); }
        start = end + 1;
    }
    return r;
}

static inline float reward_eval(const Reward* r, const std::vector<int>& completion, const std::vector<int>& answer, int eot) {
    float sum = 0.0f;
    for (RewardFn fn : r->fns) { sum += fn(completion, answer, eot); }
    return sum;
}

// A verifier is user code: a non-finite reward would poison the advantages and then every
// weight. Such rewards are replaced by 0 and counted; the caller reports the count.
static inline int rl_sanitize_rewards(float* rewards, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(rewards[i])) { rewards[i] = 0.0f; bad++; }
    }
    return bad;
}

// ---- advantages
enum { RL_GRPO, RL_BASELINE, RL_TOP1 };

static inline int rl_mode_parse(const char* s) {
    if (strcmp(s, "grpo") == 0) { return RL_GRPO; }
    if (strcmp(s, "baseline") == 0) { return RL_BASELINE; }
    if (strcmp(s, "top1") == 0) { return RL_TOP1; }
    die("--rl-mode must be grpo, baseline or top1, got '%s'", s);
    return -1;
}

typedef struct {
    int mode;
    float baseline;      // RL_BASELINE: running mean reward
    int have_baseline;
} Advantage;

// rewards and adv hold P*G values, group by group (row = prompt * G + sample).
static inline void rl_advantages(Advantage* a, const float* rewards, int P, int G, float* adv) {
    int n = P * G;
    if (a->mode == RL_GRPO) {
        for (int p = 0; p < P; p++) {
            const float* r = rewards + (size_t)p * G;
            double mean = 0.0, var = 0.0;
            for (int k = 0; k < G; k++) { mean += r[k]; }
            mean /= G;
            for (int k = 0; k < G; k++) { var += (r[k] - mean) * (r[k] - mean); }
            double std = sqrt(var / G);
            for (int k = 0; k < G; k++) { adv[p * G + k] = (float)((r[k] - mean) / (std + 1e-4)); }
        }
    } else if (a->mode == RL_BASELINE) {
        double mean = 0.0;
        for (int i = 0; i < n; i++) { mean += rewards[i]; }
        mean /= n;
        if (!a->have_baseline) { a->baseline = (float)mean; a->have_baseline = 1; }
        for (int i = 0; i < n; i++) { adv[i] = rewards[i] - a->baseline; }
        a->baseline = 0.9f * a->baseline + 0.1f * (float)mean;   // after use: no peeking at this batch
    } else {
        for (int i = 0; i < n; i++) { adv[i] = rewards[i]; }
    }
}

// ---- the training rows of one rollout: prompt + completion, cut into (input, target) pairs.
// Target position t-1 predicts token t; the completion's tokens are t = len(prompt) ..
// len(seq)-1, so the weights sit at positions len(prompt)-1 .. len(seq)-2. Rows are padded
// to T with end-of-text and weight 0.
typedef struct {
    int rows, T;
    std::vector<int> inputs, targets;   // rows x T
    std::vector<float> mask;            // 1 on completion targets
    std::vector<float> logp, logp_ref;  // rows x T: log p(target) of the policy and of the reference
} RolloutBatch;

// T is the longest row, rounded up to a multiple of t_multiple (sequence parallelism splits
// every sequence over tp ranks): the padding positions hold eot with mask 0, and causal
// attention keeps them from changing any earlier position.
static inline void rollout_batch_build(RolloutBatch* rb, const std::vector<std::vector<int>>& prompts,
                                       const std::vector<std::vector<int>>& completions, int eot, int t_multiple) {
    int rows = (int)prompts.size(), T = 1;
    for (int i = 0; i < rows; i++) { T = std::max(T, (int)(prompts[i].size() + completions[i].size()) - 1); }
    T = (T + t_multiple - 1) / t_multiple * t_multiple;
    rb->rows = rows;
    rb->T = T;
    rb->inputs.assign((size_t)rows * T, eot);
    rb->targets.assign((size_t)rows * T, eot);
    rb->mask.assign((size_t)rows * T, 0.0f);
    rb->logp.assign((size_t)rows * T, 0.0f);
    rb->logp_ref.assign((size_t)rows * T, 0.0f);
    for (int i = 0; i < rows; i++) {
        std::vector<int> seq = prompts[i];
        seq.insert(seq.end(), completions[i].begin(), completions[i].end());
        for (int t = 0; t + 1 < (int)seq.size(); t++) {
            rb->inputs[(size_t)i * T + t] = seq[t];
            rb->targets[(size_t)i * T + t] = seq[t + 1];
            if (t + 1 >= (int)prompts[i].size()) { rb->mask[(size_t)i * T + t] = 1.0f; }
        }
    }
}

// Loss weights of the rows (see the top of the file): w = mask * (A_row + beta * (exp(l) - 1)),
// l = logp_ref - logp. Also returns the sums for the step line: sum of -A*logp over completion
// tokens, sum of k3 (both to be divided by N).
static inline void rl_token_weights(const RolloutBatch* rb, const float* adv, float beta, std::vector<float>* weights,
                                    double* pg_sum, double* kl_sum) {
    size_t n = (size_t)rb->rows * rb->T;
    weights->assign(n, 0.0f);
    double pg = 0.0, kl = 0.0;
    for (int i = 0; i < rb->rows; i++) {
        for (int t = 0; t < rb->T; t++) {
            size_t j = (size_t)i * rb->T + t;
            if (rb->mask[j] == 0.0f) { continue; }
            float w = adv[i];
            pg += -(double)adv[i] * rb->logp[j];
            if (beta > 0.0f) {
                // clamped so that a token the policy finds very unlikely (p / p_ref < e^-20)
                // cannot turn into an infinite weight
                double l = std::min(20.0, std::max(-20.0, (double)rb->logp_ref[j] - rb->logp[j]));
                double ratio = exp(l);
                kl += ratio - l - 1.0;
                w += beta * (float)(ratio - 1.0);
            }
            (*weights)[j] = w;
        }
    }
    *pg_sum = pg;
    *kl_sum = kl;
}

// log p(target) of every (row, position) of a rollout batch under `model`: forward passes of
// at most model->max_B rows, cross-entropy without gradients (CE = -log p).
static inline void rl_logp(GPT2* model, const RolloutBatch* rb, std::vector<float>* out) {
    int T = rb->T;
    out->assign((size_t)rb->rows * T, 0.0f);
    for (int r0 = 0; r0 < rb->rows; r0 += model->max_B) {
        int n = std::min(model->max_B, rb->rows - r0);
        gpt2_forward(model, rb->inputs.data() + (size_t)r0 * T, n, T);
        gpt2_classifier(model, rb->targets.data() + (size_t)r0 * T, NULL, 0.0f, 0);
        for (size_t j = 0; j < (size_t)n * T; j++) { (*out)[(size_t)r0 * T + j] = -model->losses_host[j]; }
    }
}

// ---- one rollout: everything the RL step does before its micro-steps
// gather(mine, n, all, ctx): all-gather n floats from every data-parallel rank (rank order)
typedef void (*GatherFn)(const float* mine, int n, float* all, void* ctx);

typedef struct {
    Reward reward;
    Advantage advantage;
    float beta;                        // KL coefficient, 0 = no reference model
    GenerateConfig gen;
    int group;                         // G samples per prompt
    int t_multiple;                    // rollout batches' T is a multiple of this (tp with SP, else 1)
    uint64_t seed;
    std::vector<SFTExample> examples;  // prompts and their verifier answers
    KVCache kv;
    GPT2* ref;                         // frozen reference model (NULL when beta = 0)
    // this step, this rank's rows
    std::vector<std::vector<int>> prompts, completions;
    RolloutBatch rb;
    std::vector<float> weights;
    // this step, over all ranks
    long num_tokens;                   // N: completion tokens (the loss's normaliser)
    double reward_mean, accuracy, length_mean, kl, loss;
    int bad_rewards;
    std::vector<float> rewards_all;    // P*G, for tests and logs
} RLState;

static inline uint64_t rl_mix64(uint64_t x) {   // splitmix64's finaliser: decorrelates seeds
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Global rollout rows are row = prompt * G + sample, prompt = 0..P-1 of this step; this rank
// owns rows [row0, row0 + rows). Row g of step s draws from its own stream seeded by
// (seed, s, g), so the samples do not depend on the number of ranks.
static inline void rl_rollout(RLState* rl, GPT2* model, int step, int rows_global, int row0, int rows, int eot,
                              GatherFn gather, void* ctx) {
    int G = rl->group, P = rows_global / G;
    int nex = (int)rl->examples.size();
    rl->prompts.assign(rows, std::vector<int>());
    std::vector<Rng> rngs(rows);
    for (int i = 0; i < rows; i++) {
        int g = row0 + i;
        size_t ex = ((size_t)step * P + g / G) % nex;
        rl->prompts[i] = rl->examples[ex].prompt;
        rng_init(&rngs[i], rl_mix64(rl_mix64(rl->seed) ^ ((uint64_t)step << 32) ^ (uint64_t)g));
    }
    generate(model, &rl->kv, rl->prompts, &rl->gen, rngs.data(), eot, &rl->completions);

    // score this rank's rows, then share (reward, length, exact match) of every row
    std::vector<float> mine(3 * rows), all(3 * rows_global);
    for (int i = 0; i < rows; i++) {
        size_t ex = ((size_t)step * P + (row0 + i) / G) % nex;
        const std::vector<int>& answer = rl->examples[ex].answer;
        mine[3 * i] = reward_eval(&rl->reward, rl->completions[i], answer, eot);
        mine[3 * i + 1] = (float)rl->completions[i].size();
        mine[3 * i + 2] = reward_exact_match(rl->completions[i], answer, eot);
    }
    gather(mine.data(), 3 * rows, all.data(), ctx);
    rl->rewards_all.assign(rows_global, 0.0f);
    double len = 0.0, acc = 0.0;
    for (int g = 0; g < rows_global; g++) {
        rl->rewards_all[g] = all[3 * g];
        len += all[3 * g + 1];
        acc += all[3 * g + 2];
    }
    rl->bad_rewards = rl_sanitize_rewards(rl->rewards_all.data(), rows_global);
    double rsum = 0.0;
    for (float r : rl->rewards_all) { rsum += r; }
    rl->reward_mean = rsum / rows_global;
    rl->accuracy = acc / rows_global;
    rl->length_mean = len / rows_global;
    rl->num_tokens = (long)len;
    std::vector<float> adv(rows_global);
    rl_advantages(&rl->advantage, rl->rewards_all.data(), P, G, adv.data());

    // the training rows, log-probabilities for the KL term, and the loss weights
    rollout_batch_build(&rl->rb, rl->prompts, rl->completions, eot, rl->t_multiple);
    if (rl->beta > 0.0f) {
        rl_logp(model, &rl->rb, &rl->rb.logp);
        rl_logp(rl->ref, &rl->rb, &rl->rb.logp_ref);
    }
    double pg = 0.0, kl = 0.0;
    rl_token_weights(&rl->rb, adv.data() + row0, rl->beta, &rl->weights, &pg, &kl);
    rl->kl = 0.0;
    rl->loss = NAN;   // without KL the trainer takes the loss from the classifier (sum of w * CE = pg)
    if (rl->beta > 0.0f) {   // the loss and KL of the step: per-rank sums, gathered and added up
        float sums[2] = {(float)pg, (float)kl};
        std::vector<float> sums_all(2 * (rows_global / rows));
        gather(sums, 2, sums_all.data(), ctx);
        pg = kl = 0.0;
        for (size_t k = 0; k < sums_all.size(); k += 2) { pg += sums_all[k]; kl += sums_all[k + 1]; }
        double N = std::max(1L, rl->num_tokens);
        rl->kl = kl / N;
        rl->loss = pg / N + rl->beta * rl->kl;
    }
}
