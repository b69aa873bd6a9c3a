// What the planner prints: the machine and the model (planner_print_header), the ranked table
// of candidates with each one's memory per category, bytes per communicator and predicted times
// (planner_print_table), the best of each family of strategies, why the best wins, and when
// nothing runs or fits, why and what would (planner_explain_nothing).
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>
#include "search.h"

// a candidate in one line of the table
static inline std::string candidate_name(const Candidate* c) {
    char s[160];
    snprintf(s, sizeof(s), "dp %d pp %d cp %d tp %d%s%s | zero %d", c->dp, c->pp, c->cp, c->tp, c->ep > 1 ? " ep " : "",
             c->ep > 1 ? std::to_string(c->ep).c_str() : "", c->zero);
    std::string out = s;
    if (c->sp) { out += " sp"; }
    if (c->pp > 1) { out += std::string(" ") + pp_schedule_name(c->sched) + (c->v > 1 ? " v" + std::to_string(c->v) : ""); }
    out += " m " + std::to_string(c->micro);
    if (c->recompute != RECOMPUTE_NONE) { out += std::string(" rc ") + gpt2_recompute_name(c->recompute); }
    return out;
}

// the flags that run it
static inline std::string candidate_flags(const Candidate* c) {
    std::string s = "--dp " + std::to_string(c->dp);
    if (c->tp > 1) { s += " --tp " + std::to_string(c->tp) + (c->sp ? " --sp" : ""); }
    if (c->pp > 1) {
        s += " --pp " + std::to_string(c->pp) + " --pp-schedule " + pp_schedule_name(c->sched);
        if (c->v > 1) { s += " --pp-chunks " + std::to_string(c->v); }
    }
    if (c->cp > 1) { s += " --cp " + std::to_string(c->cp); }
    if (c->ep > 1) { s += " --ep " + std::to_string(c->ep); }
    if (c->zero) { s += " --zero " + std::to_string(c->zero); }
    s += " --grad-accum " + std::to_string(c->micro);
    if (c->recompute != RECOMPUTE_NONE) { s += std::string(" --recompute ") + gpt2_recompute_name(c->recompute); }
    return s;
}

static inline double gib(double b) { return b / 1073741824.0; }

static inline void planner_print_header(const TrainArgs* a, const GPT2Config* cfg, int devices, const Machine* mc) {
    printf("planner      %s: %d layers, %d heads, C %d, V %d%s; batch %d x %d tokens; %s floatX (%zu bytes)\n",
           a->load ? a->load : a->model, cfg->num_layers, cfg->num_heads, cfg->channels, cfg->vocab_size,
           gpt2_is_moe(cfg) ? (", " + std::to_string(cfg->num_experts) + " experts top-" + std::to_string(cfg->moe_topk)).c_str() : "",
           a->batch, a->seq, BACKEND_NAME, sizeof(floatX));
    printf("machine      %s: %d devices, %d per node, %.2f GiB each, peak %.3g TFLOP/s x efficiency %.2f, "
           "links %.0f us + %.1f GB/s inside a node, %.0f us + %.1f GB/s between%s\n", mc->name.c_str(), devices, mc->per_node,
           gib(mc->mem), mc->peak / 1e12, mc->eff, mc->alpha[0] * 1e6, mc->bw[0] / 1e9, mc->alpha[1] * 1e6, mc->bw[1] / 1e9,
           mc->inter_shared ? " (a node's, shared by its devices)" : "");
}

static inline void planner_print_row(int i, const Prediction& p) {
    const RankFigures* w = &p.worst;
    printf("%3d  %-56s %7.2f %7.2f %7.2f %7.2f %7.2f | %8.1f %8.1f %8.1f %8.1f %8.1f | %9.2f %9.2f %9.2f %9.2f  %s\n", i,
           candidate_name(&p.c).c_str(), gib(w->mem[FIG_PARAMS] + w->mem[FIG_GRADS]), gib(w->mem[FIG_MASTER] + w->mem[FIG_OPTIM]),
           gib(w->mem[FIG_ACTS]), gib(w->mem[FIG_EXPERTS]), gib(p.mem_total), w->bytes[FIG_DP] / 1048576.0, w->bytes[FIG_TP] / 1048576.0,
           (w->bytes[FIG_PP] + w->bytes[FIG_PP_EMBED]) / 1048576.0, w->bytes[FIG_CP] / 1048576.0,
           (w->bytes[FIG_EP] + w->bytes[FIG_EDP]) / 1048576.0, p.compute * 1e3, p.bubble * 1e3, p.exposed * 1e3, p.step * 1e3,
           p.fits ? "fits" : "too big");
}

static inline void planner_print_table(const std::vector<Prediction>& rows, size_t top) {
    printf("  #  %-56s %7s %7s %7s %7s %7s | %8s %8s %8s %8s %8s | %9s %9s %9s %9s\n", "candidate", "P+G", "master", "acts",
           "experts", "GiB", "dp MiB", "tp MiB", "pp MiB", "cp MiB", "ep MiB", "compute", "bubble", "comm", "step ms");
    for (size_t i = 0; i < rows.size() && i < top; i++) { planner_print_row((int)i + 1, rows[i]); }
}

// The best of each family: why the winner wins (TP inside a node, PP across, when CP pays, ...)
static inline void planner_print_families(const PlanResult& res) {
    struct { const char* name; std::function<bool(const Candidate&)> in; } fam[] = {
        {"data parallel only (ZeRO 0-3)", [](const Candidate& c) { return c.tp == 1 && c.pp == 1 && c.cp == 1; }},
        {"with tensor parallelism", [](const Candidate& c) { return c.tp > 1 && c.pp == 1 && c.cp == 1; }},
        {"with a pipeline", [](const Candidate& c) { return c.pp > 1 && c.cp == 1; }},
        {"with context parallelism", [](const Candidate& c) { return c.cp > 1; }},
        {"with experts split (ep)", [](const Candidate& c) { return c.ep > 1; }},
    };
    printf("best of each family (the first that fits, else the smallest):\n");
    for (auto& f : fam) {
        const Prediction* best = NULL;
        const Prediction* smallest = NULL;
        for (const Prediction& p : res.valid) {
            if (!f.in(p.c)) { continue; }
            if (!best && p.fits) { best = &p; }
            if (!smallest || p.mem_total < smallest->mem_total) { smallest = &p; }
        }
        if (!best && !smallest) { continue; }
        const Prediction* p = best ? best : smallest;
        printf("  %-32s %-56s %8.2f GiB %s, step %9.2f ms (compute %.2f, bubble %.2f, comm %.2f)\n", f.name, candidate_name(&p->c).c_str(),
               gib(p->mem_total), p->fits ? "fits   " : "too big", p->step * 1e3, p->compute * 1e3, p->bubble * 1e3, p->exposed * 1e3);
    }
}

// Why nothing runs, and what would: the reasons, and the nearest machine that works.
static inline void planner_explain_nothing(const TrainArgs* a, const GPT2Config* cfg, int devices, const Machine* mc,
                                           const PlanResult& res) {
    if (res.valid.empty()) {
        // the reasons of the plain meshes (ZeRO 0, 1f1b, no SP: not the combinations that are not built)
        PlanResult q = planner_run(a, cfg, devices, mc, 1);
        if (res.total == 0) {
            printf("nothing runs: no mesh of %d devices splits this model and batch (tp a divisor of the %d heads, cp of the "
                   "sequence's %d tokens, dp of the batch's %d sequences, pp at most the %d layers)\n", devices,
                   cfg->num_heads, a->seq, a->batch, cfg->num_layers);
        } else {
            printf("nothing runs: all %zu candidates for %d devices are refused by the trainer's checks; the reasons for the "
                   "%zu plain meshes:\n", res.total, devices, q.total);
        }
        std::vector<std::pair<int, std::string>> why;
        for (auto& kv : q.refused) { why.push_back({kv.second, kv.first}); }
        std::sort(why.rbegin(), why.rend());
        for (size_t i = 0; i < why.size() && i < 6; i++) { printf("  %5d x %s\n", why[i].first, why[i].second.c_str()); }
        std::vector<int> sizes;   // the meshes that can split this model and batch, below --devices
        for (int tp : divisors(cfg->num_heads)) {
            for (int cp : divisors(a->seq)) {
                for (int pp = 1; pp <= cfg->num_layers; pp++) {
                    for (int dp : divisors(a->batch)) {
                        long long n = (long long)dp * pp * cp * tp;
                        if (n < devices) { sizes.push_back((int)n); }
                    }
                }
            }
        }
        std::sort(sizes.rbegin(), sizes.rend());
        sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
        for (int n : sizes) {   // the most devices this model and batch can use
            PlanResult r = planner_run(a, cfg, n, mc, 1);
            if (!r.valid.empty()) {
                printf("what would: %d devices (e.g. %s%s), or a larger --batch / --seq for more data and context "
                       "parallelism\n", n, candidate_flags(&r.valid[0].c).c_str(), r.valid[0].fits ? "" : "; memory aside");
                return;
            }
        }
        return;
    }
    const Prediction& s = *std::min_element(res.valid.begin(), res.valid.end(),
                                            [](const Prediction& x, const Prediction& y) { return x.mem_total < y.mem_total; });
    printf("nothing fits: the smallest candidate, %s, needs %.3f GiB per device; the planner allows 90%% of %.3f GiB = %.3f GiB\n",
           candidate_name(&s.c).c_str(), gib(s.mem_total), gib(mc->mem), gib(0.9 * mc->mem));
    printf("what would: devices of at least %.3f GiB (--device-mem %.3f)", gib(s.mem_total / 0.9), gib(s.mem_total / 0.9) + 0.001);
    for (int n = devices * 2; n <= devices * 64; n *= 2) {   // more devices: more to split the model over
        PlanResult r = planner_run(a, cfg, n, mc);   // devices of this size, more of them
        if (!r.valid.empty() && r.valid[0].fits) {
            printf(", or %d devices (%s, %.3f GiB)", n, candidate_flags(&r.valid[0].c).c_str(), gib(r.valid[0].mem_total));
            break;
        }
    }
    printf("\n");
}

// --plan all: the ranked table; returns the best that fits (NULL: none)
static inline const Prediction* planner_report(const TrainArgs* a, const GPT2Config* cfg, int devices, const Machine* mc,
                                               const PlanResult& res) {
    planner_print_header(a, cfg, devices, mc);
    size_t fit = 0;
    for (const Prediction& p : res.valid) { fit += p.fits; }
    printf("candidates   %zu: %zu refused by the trainer's checks, %zu run, %zu of them fit\n", res.total,
           res.total - res.valid.size(), res.valid.size(), fit);
    if (res.valid.empty() || !res.valid[0].fits) {
        planner_print_table(res.valid, std::min<size_t>(a->plan_top, 5));
        planner_explain_nothing(a, cfg, devices, mc, res);
        return NULL;
    }
    planner_print_table(res.valid, a->plan_top);
    planner_print_families(res);
    const Prediction& b = res.valid[0];
    printf("best         %s\n", candidate_flags(&b.c).c_str());
    printf("  because    it fits (%.3f GiB of %.3f) and its predicted step is the shortest: compute %.2f ms + bubble %.2f ms + "
           "exposed communication %.2f ms", gib(b.mem_total), gib(0.9 * mc->mem), b.compute * 1e3, b.bubble * 1e3, b.exposed * 1e3);
    for (int k = 0; k < FIG_NCOMM; k++) {
        if (b.comm[k] > 0) {
            printf("%s%s %.2f ms %s", k == 0 || b.comm[0] == 0 ? " (" : ", ", FIG_COMM_NAMES[k], b.comm[k] * 1e3,
                   group_extent(&b.c, k) > mc->per_node ? "between nodes" : "inside a node");
        }
    }
    int any = 0;
    for (int k = 0; k < FIG_NCOMM; k++) { any |= b.comm[k] > 0; }
    printf("%s\n", any ? " before overlap)" : "");
    const Prediction* other = NULL;   // the best on another mesh
    for (const Prediction& p : res.valid) {
        if (p.c.dp != b.c.dp || p.c.pp != b.c.pp || p.c.cp != b.c.cp || p.c.tp != b.c.tp || p.c.ep != b.c.ep) { other = &p; break; }
    }
    if (other) {
        const Prediction& r = *other;
        printf("  next mesh  %s: %.2f ms (%+.1f%%)%s\n", candidate_name(&r.c).c_str(), r.step * 1e3, 100.0 * (r.step / b.step - 1.0),
               r.fits ? "" : ", does not fit");
    }
    return &res.valid[0];
}

// --plan this: the flags' own mesh (--dp, default 1, x --pp x --cp x --tp), every rank's figures
// (the format of --plan-check)
static inline int planner_this(const TrainArgs* a, const GPT2Config* cfg, int devices, const Machine* mc) {
    Candidate c = candidate_of_args(a, devices);
    std::vector<RankFigures> ranks;
    Prediction p = planner_evaluate(a, cfg, &c, mc, 1, &ranks);
    planner_print_header(a, cfg, c.dp * c.pp * c.cp * c.tp, mc);
    if (!p.why.empty()) { die("--plan this: %s", p.why.c_str()); }
    printf("mesh         %s (%s)\n", candidate_name(&c).c_str(), candidate_flags(&c).c_str());
    for (size_t r = 0; r < ranks.size(); r++) { figures_print(stdout, (int)r, &ranks[r]); }
    planner_print_table(std::vector<Prediction>{p}, 1);
    return 0;
}

