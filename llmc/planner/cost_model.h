// The planner's cost model: what one candidate mesh costs, per rank and per step, predicted
// without running a step. For a rank it builds a dry model (the shapes only, llmc/model/gpt2.h's
// gpt2_shape_shard) at the rank's place and asks the same formula functions the trainer prints
// its memory tables and byte counts with (planner_rank); from the worst rank's figures and the
// machine (llmc/planner/machine.h) it predicts the step's time (planner_time).
//
// Memory per device (bytes, a = sizeof(floatX): 4 in the CPU build, 2 in the CUDA build, Psi the
// parameters a rank holds after tp and pp split them, N = dp cp the ranks that average gradients):
//   parameters a Psi (ZeRO-3: a Psi/N) | gradients a Psi (ZeRO-2/3: a Psi/N) | master 4 Psi and
//   m, v 8 Psi (ZeRO-1/2/3: over N) | activations (doc/memory.md: per slot and layer
//   B Ts (6 C a + 16) + B T 12 C a/tp + attention state, fewer with --recompute, slots = the
//   schedule's peak in flight) | experts (ep: their parameters and state, E/ep of them)
// Time per step (a model, not a measurement: doc/choosing-a-strategy.md):
//   compute  = 6 Psi_active + 12 L C T FLOPs per token (+ the forward again with --recompute full,
//              the attention core's with selective) x tokens / (devices x peak x efficiency)
//   bubble   = compute x b / (1 - b), b = pp_formula_bubble (F = 1, B = 2; zb-h1 F = B = W = 1)
//   comm     = per communicator: messages x alpha + bytes / bandwidth, the link inside a node if
//              the group fits in one (tp is the mesh's fastest dimension, then cp, pp, dp)
//   exposed  = tp, pp, ep, edp: all of it (the compute waits); cp: what the attention core of
//              the block does not hide; dp: what the backward (2/3 of the compute) does not hide,
//              and at least the last bucket's share (ZeRO-3's gathers are counted in the same dp bytes,
//              prefetched a block ahead: they are modelled as hidden the same way)
//   step     = compute + bubble + exposed
#pragma once

#include <string.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../model/gpt2.h"
#include "../plan/train_args.h"
#include "../train/rank_figures.h"
#include "../plan/parallel_config.h"
#include "../parallel/mesh.h"
#include "../parallel/placement.h"
#include "../parallel/dp.h"
#include "../parallel/tp.h"
#include "../parallel/tp_accounting.h"
#include "../parallel/pp.h"
#include "../parallel/pp_accounting.h"
#include "../parallel/cp.h"
#include "../parallel/ep.h"
#include "machine.h"

// ---------------------------------------------------------------------------------------
// A candidate: the mesh and the settings that change memory or time.

typedef struct {
    int dp, pp, cp, tp, ep;
    int sp, zero, micro;      // micro: micro-batches per step (--grad-accum; the pipeline's m)
    int sched, v;             // pipeline schedule (pp_schedule.h) and chunks per stage
    int recompute;            // RECOMPUTE_NONE, _SELECTIVE, _FULL
} Candidate;

// ---------------------------------------------------------------------------------------
// One rank of a candidate, dry: the same set-up order as the trainer (model, cp's op, the
// pipeline's slots, activations, data parallelism's layout), and the formulas.

typedef struct {
    RankFigures fig;
    size_t buckets;           // data parallelism's buckets (messages of its collectives)
    int local_layers, moe_blocks, B, Tl;
} RankPlan;

static inline RankPlan planner_rank(const TrainArgs* a, const GPT2Config* cfg, const int size[4], const int coord[4],
                                    const std::vector<int>& split) {
    RankPlan out;
    memset(&out, 0, sizeof(out));
    int dp = size[MESH_DP], pp = size[MESH_PP], cp = size[MESH_CP], tp = size[MESH_TP], micro = a->grad_accum;
    if (a->batch % (micro * dp) != 0) {   // (plan_micro_batch's check)
        die("--batch %d does not split into %d micro-steps x %d data-parallel ranks", a->batch, micro, dp);
    }
    int B = a->batch / (micro * dp), T = a->seq, Tl = T / cp;
    PlaceConfig pc = place_config_from_args(a);
    GPT2Place place = place_at(&pc, cfg, size, coord, split);
    GPT2 m;
    gpt2_shape_shard(&m, cfg, &place);
    struct MoEDone { GPT2* m; ~MoEDone() { moe_free(m->moe); m->moe = NULL; } } moe_done{&m};   // the dry model's routing state
    m.recompute = gpt2_recompute_parse(a->recompute);
    if (T > cfg->max_seq_len) { die("--seq %d exceeds the model's maximum sequence length %d", T, cfg->max_seq_len); }
    ContextParallel cpx{};
    int zigzag = strcmp(a->cp_split, "zigzag") == 0;
    CPAlgo algo = cp_algo_parse(a->cp_algo);
    if (cp > 1) {
        cp_check(&m, cp, algo, zigzag, T);
        cp_shape(&cpx, cp, coord[MESH_CP], algo, zigzag, T);
        cpx.model = &m;
        cp_install_op(&cpx, &m);
    }
    int slots = 1, sched = pp_schedule_parse(a->pp_schedule);
    if (pp > 1) {
        std::string err = pp_schedule_check(sched, pp, micro, a->pp_chunks);
        if (!err.empty()) { die("--pp-schedule %s: %s", pp_schedule_name(sched), err.c_str()); }
        slots = pp_peak_inflight(pp_build(sched, pp, micro, a->pp_chunks))[coord[MESH_PP]];
    }
    gpt2_activations_slots(&m, B, Tl, slots, 1);
    // data parallelism over the dp x cp ranks (mesh.h's dp_cp: rank dp_i cp + cp_i)
    DPConfig dcfg = dp_config_from_args(a, pp > 1, a->ep > 1);
    DataParallel dpx;
    int N = dp * cp, r = coord[MESH_DP] * cp + coord[MESH_CP];
    dp_shape(&dpx, &m, N, r, &dcfg);
    if (strcmp(a->dp_mode, "ddp") != 0 || a->offload || a->comm_chunk_kb > 0 || strcmp(a->compress, "none") != 0 || a->qwz || a->hpz || a->qgz) {
        die("the planner knows --dp-mode ddp with --zero 0-3 (no --offload, ZeRO++, chunks or compression): plan without them");
    }
    buckets_layout(&dpx, a->zero);
    size_t f[MEM_NCAT];
    dp_formula_memory(&dpx, f);
    RankFigures* g = &out.fig;
    g->mem[FIG_PARAMS] = f[MEM_PARAMS];
    g->mem[FIG_GRADS] = f[MEM_GRADS];
    g->mem[FIG_MASTER] = f[MEM_MASTER];
    g->mem[FIG_OPTIM] = f[MEM_OPTIM];
    g->mem[FIG_ACTS] = f[MEM_ACTS];
    g->bytes[FIG_DP] = dp_formula_bytes(&dpx, micro);
    if (tp > 1) {
        TensorParallel tpx{};
        tpx.tp = tp;
        tpx.rank = coord[MESH_TP];
        tpx.sp = a->sp;
        tpx.model = &m;
        g->bytes[FIG_TP] = tp_formula_bytes(&tpx, micro, B, Tl, a->sp ? buckets_norm_elems(&dpx, a->zero) : 0);
    }
    if (pp > 1) {
        PipelineParallel ppx;
        ppx.p = pp;
        ppx.stage = coord[MESH_PP];
        ppx.v = a->pp_chunks;
        ppx.m = micro;
        ppx.model = &m;
        g->bytes[FIG_PP] = pp_formula_bytes(&ppx, B, Tl);
        g->bytes[FIG_PP_EMBED] = pp_formula_embed_bytes(&ppx);
    }
    if (cp > 1) { g->bytes[FIG_CP] = cp_formula_bytes(&cpx, micro, B); }
    if (a->ep > 1) {   // the ep groups are formed from the dp x cp group (ep.h): edp rank r / ep of N / ep
        size_t count = ep_formula_expert_params(cfg, &place);
        g->mem[FIG_EXPERTS] = count * sizeof(floatX) + ep_formula_state_bytes(count);
        g->bytes[FIG_EDP] = ep_formula_edp_bytes(count, N / a->ep, r / a->ep);
        double pairs = (double)B * Tl * cfg->moe_topk * m.moe->blocks * micro;
        g->bytes[FIG_EP] = (uint64_t)ep_formula_balanced_bytes((size_t)cfg->channels, pairs, a->ep);
    }
    out.buckets = dpx.buckets.size();
    out.local_layers = gpt2_local_layers(&m);
    out.moe_blocks = m.moe ? m.moe->blocks : 0;
    out.B = B;
    out.Tl = Tl;
    return out;
}

// the mesh coordinates of world rank r (mesh.h: rank = ((dp_i pp + pp_i) cp + cp_i) tp + tp_i)
static inline void coord_of_rank(const int size[4], int r, int coord[4]) {
    for (int d = 3; d >= 0; d--) { coord[d] = r % size[d]; r /= size[d]; }
}

// ---------------------------------------------------------------------------------------
// A candidate's prediction: the worst rank's memory, its bytes, the time model.

typedef struct {
    Candidate c;
    std::string why;            // "" when the trainer's checks pass; else the first check that fails
    RankFigures worst;          // per category and communicator, the largest over the ranks evaluated
    uint64_t mem_total;         // the largest total over the ranks
    int fits;
    double compute, bubble, exposed, step;   // seconds
    double comm[FIG_NCOMM];     // seconds each communicator takes (before overlap)
} Prediction;

// the extent of a communicator's group in consecutive ranks: tp innermost, then cp, pp, dp
static inline int group_extent(const Candidate* c, int which) {
    int world = c->dp * c->pp * c->cp * c->tp;
    switch (which) {
        case FIG_TP: return c->tp;
        case FIG_CP: return c->cp * c->tp;
        case FIG_PP: return c->pp * c->cp * c->tp;
        case FIG_PP_EMBED: return c->pp * c->cp * c->tp;
        case FIG_EP: return c->ep * c->pp * c->cp * c->tp;
        default: return c->dp > 1 ? world : c->cp * c->tp;   // dp x cp, edp
    }
}

// the distance in ranks between neighbours of a communicator's group (tp innermost, then cp, pp, dp)
static inline int group_stride(const Candidate* c, int which) {
    switch (which) {
        case FIG_TP: return 1;
        case FIG_CP: return c->tp;
        case FIG_PP: case FIG_PP_EMBED: return c->cp * c->tp;
        default: return c->dp > 1 ? c->pp * c->cp * c->tp : c->tp;   // dp (x cp), ep, edp
    }
}

// The predicted step time of a candidate whose worst rank's figures are in p (the formulas at the top)
static inline void planner_time(Prediction* p, const GPT2Config* cfg, const TrainArgs* a, const Machine* mc, const RankPlan* rp) {
    const Candidate* c = &p->c;
    int world = c->dp * c->pp * c->cp * c->tp;
    double tokens = (double)a->batch * a->seq, L = cfg->num_layers, C = cfg->channels, T = a->seq;
    GPT2 whole;
    memset(&whole, 0, sizeof(whole));
    whole.config = *cfg;
    GPT2Place wp = gpt2_place_whole(cfg);
    ParamInfo info[NUM_PARAMETER_TENSORS];
    fill_param_table(info, cfg, &wp);
    whole.num_parameters_full = param_table_total(info);
    double per_token = gpt2_flops_per_token(&whole, a->seq);
    if (c->recompute == RECOMPUTE_FULL) { per_token += per_token / 3.0; }           // the forward again
    if (c->recompute == RECOMPUTE_SELECTIVE) { per_token += 4.0 * L * C * T; }      // the attention core's forward again
    p->compute = per_token * tokens / (world * mc->peak * mc->eff);
    double b = 0.0;
    if (c->pp > 1) {
        PPCosts costs = c->sched == PP_ZBH1 ? PPCosts{1.0, 1.0, 1.0, 0.0} : PPCosts{1.0, 2.0, 0.0, 0.0};
        b = pp_formula_bubble(c->sched, c->pp, c->micro, c->v, costs);
    }
    p->bubble = p->compute * b / (1.0 - b);
    // messages per step of each communicator (for the alpha term): ring steps of its collectives
    int N = c->dp * c->cp, m = c->micro;
    double dp_colls = c->zero == 3 ? 3.0 * m : (c->zero == 2 ? m + 1.0 : 2.0);
    double msgs[FIG_NCOMM] = {
        dp_colls * rp->buckets * (N - 1),
        (4.0 * rp->local_layers + 2) * m * 2 * (c->tp - 1),
        2.0 * m * c->v,
        2.0,
        2.0 * rp->local_layers * m * (c->cp - 1),
        4.0 * rp->moe_blocks * m * (c->ep - 1),
        2.0 * (N / std::max(1, c->ep) - 1)};
    for (int k = 0; k < FIG_NCOMM; k++) {
        p->comm[k] = 0.0;
        if (p->worst.bytes[k] == 0) { continue; }
        int inter = group_extent(c, k) > mc->per_node;
        // a node's one link between nodes (--links ... shared): every group of the kind talks at
        // once, and a ring sends one flow per group out of each node, so the node's link is shared
        // by as many flows as groups have a rank on it: min(per_node, the group's stride). dp 4 on
        // 2 nodes of 2: one group, ranks 0 1 | 2 3, one flow each way. dp 2 x tp 2: two dp groups
        // {0,2} {1,3}, two flows out of each node.
        double bw = inter && mc->inter_shared ? mc->bw[1] / std::min(mc->per_node, group_stride(c, k)) : mc->bw[inter];
        p->comm[k] = msgs[k] * mc->alpha[inter] + p->worst.bytes[k] / bw;
    }
    double backward = p->compute * 2.0 / 3.0;
    double dp_exposed = std::max(p->comm[FIG_DP] - backward, p->comm[FIG_DP] / std::max<size_t>(1, rp->buckets));
    double attention = p->compute * (12.0 * L * C * T) / gpt2_flops_per_token(&whole, a->seq);   // the attention core's share
    double cp_exposed = std::max(0.0, p->comm[FIG_CP] - attention);
    p->exposed = dp_exposed + cp_exposed + p->comm[FIG_TP] + p->comm[FIG_PP] + p->comm[FIG_PP_EMBED] + p->comm[FIG_EP] + p->comm[FIG_EDP];
    p->step = p->compute + p->bubble + p->exposed;
}
