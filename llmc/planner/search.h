// The planner's search: every candidate for `devices` devices (planner_candidates: the meshes
// dp x pp x cp x tp that can split the model at all, times ZeRO 0-3, --sp, the pipeline
// schedules, --recompute and the micro-batches), each through the trainer's own checks and the
// cost model (planner_evaluate, llmc/planner/cost_model.h), then ranked: the fitting first, then
// the shortest predicted step (planner_run). What it prints is in llmc/planner/report.h, the
// entry points (--plan, --mesh auto) in llmc/planner/planner.h.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>
#include "../plan/train_args.h"
#include "../train/train_args_check.h"
#include "cost_model.h"

// ---------------------------------------------------------------------------------------
// One candidate: its flags, checked and costed as the trainer would set it up.

// the candidate's flags: the run's, with the mesh and the settings replaced
static inline TrainArgs candidate_args(const TrainArgs* base, const Candidate* c) {
    TrainArgs a = *base;
    a.dp = c->dp; a.pp = c->pp; a.cp = c->cp; a.tp = c->tp; a.ep = c->ep;
    a.sp = c->sp; a.zero = c->zero; a.grad_accum = c->micro;
    a.pp_schedule = c->pp > 1 ? pp_schedule_name(c->sched) : "1f1b";
    a.pp_chunks = c->pp > 1 ? c->v : 0;
    a.recompute = gpt2_recompute_name(c->recompute);
    a.plan = NULL;
    a.mesh = NULL;
    return a;
}
// the flags' own candidate on `world` ranks (checked flags: pp_chunks already set)
static inline Candidate candidate_of_args(const TrainArgs* a, int world) {
    int model = a->tp * a->pp * a->cp;
    Candidate c = {a->dp ? a->dp : std::max(1, world / model), a->pp, a->cp, a->tp, a->ep, a->sp, a->zero, a->grad_accum,
                   pp_schedule_parse(a->pp_schedule), a->pp_chunks > 0 ? a->pp_chunks : 1, gpt2_recompute_parse(a->recompute)};
    return c;
}

// Evaluate a candidate: the trainer's checks, every pipeline stage (or every rank), the time.
static inline Prediction planner_evaluate(const TrainArgs* base, const GPT2Config* cfg, const Candidate* c, const Machine* mc,
                                          int every_rank, std::vector<RankFigures>* ranks) {
    Prediction p;
    memset(&p.worst, 0, sizeof(p.worst));
    p.c = *c;
    p.mem_total = 0;
    p.fits = 0;
    p.compute = p.bubble = p.exposed = p.step = 0.0;
    for (int k = 0; k < FIG_NCOMM; k++) { p.comm[k] = 0.0; }
    TrainArgs a = candidate_args(base, c);
    int size[4] = {c->dp, c->pp, c->cp, c->tp};
    int world = c->dp * c->pp * c->cp * c->tp;
    RankPlan first;
    memset(&first, 0, sizeof(first));
    p.why = die_trap_run([&] {
        train_args_check(&a);   // every flag combination the trainer refuses
        if (a.ep > 1 && c->dp % a.ep != 0) {
            die("--ep %d does not divide the %d data-parallel ranks: the ep groups are formed from them", a.ep, c->dp);
        }
        std::vector<int> split = pp_split_parse(a.pp_split);   // (llmc/parallel/placement.h)
        for (int r = 0; r < (every_rank ? world : c->pp); r++) {   // every rank, or one per stage
            int coord[4] = {0, r, 0, 0};   // (dp, pp, cp, tp) of stage r's first rank
            if (every_rank) { coord_of_rank(size, r, coord); }
            RankPlan rp = planner_rank(&a, cfg, size, coord, split);
            if (r == 0) { first = rp; }
            if (ranks) { ranks->push_back(rp.fig); }
            for (int k = 0; k < FIG_NMEM; k++) { p.worst.mem[k] = std::max(p.worst.mem[k], rp.fig.mem[k]); }
            for (int k = 0; k < FIG_NCOMM; k++) { p.worst.bytes[k] = std::max(p.worst.bytes[k], rp.fig.bytes[k]); }
            p.mem_total = std::max(p.mem_total, figures_memory(&rp.fig));
        }
    });
    if (!p.why.empty()) { return p; }
    p.fits = p.mem_total <= 0.9 * mc->mem;   // 10% for the context, the allocator and buffers not counted here
    planner_time(&p, cfg, &a, mc, &first);
    return p;
}

// ---------------------------------------------------------------------------------------
// Every candidate for `devices` devices.

static inline std::vector<int> divisors(int n) {   // ascending, in sqrt(n) steps
    std::vector<int> low, high;
    for (int i = 1; (long long)i * i <= n; i++) {
        if (n % i == 0) {
            low.push_back(i);
            if (i != n / i) { high.push_back(n / i); }
        }
    }
    low.insert(low.end(), high.rbegin(), high.rend());
    return low;
}

// The meshes enumerated: the splits of the model and batch that can exist at all, each a divisor
// of what it splits: tp of the heads, cp of the sequence, dp of the batch, pp at most the layers.
// Every other split is refused by the trainer's first checks whatever the rest of the candidate,
// so it is left out before the checks run: the enumeration then grows with the model's and the
// batch's divisors, not with --devices (a million devices are planned as fast as eight).
static inline int mesh_can_split(const TrainArgs* a, const GPT2Config* cfg, int dp, int pp, int cp, int tp) {
    return cfg->num_heads % tp == 0 && a->seq % cp == 0 && a->batch % dp == 0 && pp <= cfg->num_layers;
}

// quick: the meshes alone (ZeRO 0, 1f1b, no SP, no recomputation), to find how many devices work
static inline std::vector<Candidate> planner_candidates(const TrainArgs* a, const GPT2Config* cfg, int devices, int quick = 0) {
    std::vector<Candidate> out;
    for (int tp : divisors(cfg->num_heads)) {
        if (devices % tp != 0) { continue; }
        for (int cp : divisors(a->seq)) {
            if ((devices / tp) % cp != 0) { continue; }
            for (int pp = 1; pp <= cfg->num_layers; pp++) {
                if ((devices / tp / cp) % pp != 0) { continue; }
                int dp = devices / (tp * cp * pp);
                if (!mesh_can_split(a, cfg, dp, pp, cp, tp)) { continue; }
                std::vector<int> eps = gpt2_is_moe(cfg) ? divisors(dp) : std::vector<int>{1};
                for (int ep : eps) {
                    for (int sp = 0; sp <= (tp > 1 && !quick); sp++) {
                        for (int zero = 0; zero <= (quick ? 0 : 3); zero++) {
                            std::vector<int> scheds = pp > 1 && !quick ? std::vector<int>{PP_GPIPE, PP_1F1B, PP_INTERLEAVED, PP_ZBH1}
                                                                       : std::vector<int>{PP_1F1B};
                            for (int sched : scheds) {
                                for (int rc = RECOMPUTE_NONE; rc <= (quick ? RECOMPUTE_NONE : RECOMPUTE_FULL); rc++) {
                                    for (int micro = 1; micro <= PP_MAX_MICRO; micro *= 2) {
                                        if (a->batch % (micro * dp) != 0) { continue; }
                                        Candidate c = {dp, pp, cp, tp, ep, sp, zero, micro, sched, sched == PP_INTERLEAVED ? 2 : 1, rc};
                                        out.push_back(c);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------
// Ranked: every candidate evaluated, the refused counted by their reason.

// fitting first, then the predicted step time, then memory; of those that do not fit, the smallest first
static inline bool prediction_better(const Prediction& x, const Prediction& y) {
    if (x.fits != y.fits) { return x.fits > y.fits; }
    if (!x.fits && x.mem_total != y.mem_total) { return x.mem_total < y.mem_total; }
    if (x.step != y.step) { return x.step < y.step; }
    return x.mem_total < y.mem_total;
}

typedef struct {
    std::vector<Prediction> valid;          // passed the checks, ranked
    std::map<std::string, int> refused;     // the checks' reasons, with how many candidates each refused
    size_t total;
} PlanResult;

static inline PlanResult planner_run(const TrainArgs* a, const GPT2Config* cfg, int devices, const Machine* mc, int quick = 0) {
    PlanResult res;
    std::vector<Candidate> cands = planner_candidates(a, cfg, devices, quick);
    res.total = cands.size();
    for (const Candidate& c : cands) {
        Prediction p = planner_evaluate(a, cfg, &c, mc, 0, NULL);
        if (p.why.empty()) { res.valid.push_back(p); } else { res.refused[p.why]++; }
    }
    std::stable_sort(res.valid.begin(), res.valid.end(), prediction_better);
    return res;
}

