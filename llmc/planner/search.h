// The planner: which mesh, for this model, batch and machine? (The lecture's slides on
// parallelism strategies, "Deciding on parallelism strategy".) It never runs a step: for every candidate it builds a dry model (the
// shapes only, llmc/model/gpt2.h's gpt2_shape_shard) at every place of the mesh and asks the same
// functions the trainer prints its memory tables and byte counts with.
//
//   flags ──> candidates: dp x pp x cp x tp = devices (ep | dp for an MoE), ZeRO 0-3, --sp,
//             schedule (gpipe, 1f1b, interleaved v = 2, zb-h1), --recompute, micro-batches m;
//             only the meshes that can split the model at all (tp | heads, cp | T, dp | batch,
//             pp <= layers: mesh_can_split), so any --devices is planned in well under a second
//         ──> each: the trainer's own checks (train_args_check, the place, the schedule, cp's
//             split: die() trapped into a reason, llmc/common.h's die_trap_run)
//         ──> each pipeline stage (rank dp 0, cp 0, tp 0 of it): memory per category, bytes per
//             step per communicator (planner_rank: dp_formula_memory, gpt2_activations_slots dry,
//             dp_formula_bytes, tp_formula_bytes, pp_formula_bytes, cp_formula_bytes, ep_formula_*)
//         ──> a predicted step time, fits or not, ranked; --mesh auto takes the first that fits
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

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include "../model/gpt2.h"
#include "../train/train_args.h"
#include "../parallel/mesh.h"
#include "../parallel/dp.h"
#include "../parallel/tp.h"
#include "../parallel/pp.h"
#include "../parallel/pp_accounting.h"
#include "../parallel/cp.h"
#include "../parallel/ep.h"

// ---------------------------------------------------------------------------------------
// What is predicted, and what --plan-check measures: per rank, bytes of memory per category and
// bytes sent in one step per communicator.

enum { FIG_PARAMS, FIG_GRADS, FIG_MASTER, FIG_OPTIM, FIG_ACTS, FIG_EXPERTS, FIG_NMEM };
static const char* FIG_MEM_NAMES[FIG_NMEM] = {"params", "grads", "master", "optim", "acts", "experts"};
enum { FIG_DP, FIG_TP, FIG_PP, FIG_PP_EMBED, FIG_CP, FIG_EP, FIG_EDP, FIG_NCOMM };
static const char* FIG_COMM_NAMES[FIG_NCOMM] = {"dp", "tp", "pp", "pp-embed", "cp", "ep", "edp"};

typedef struct {
    uint64_t mem[FIG_NMEM];
    uint64_t bytes[FIG_NCOMM];
} RankFigures;

static inline uint64_t figures_memory(const RankFigures* f) {
    uint64_t t = 0;
    for (int c = 0; c < FIG_NMEM; c++) { t += f->mem[c]; }
    return t;
}

// one line per rank, the format --plan this prints and --plan-check writes (test/test_planner.sh compares them)
static inline void figures_print(FILE* out, int rank, const RankFigures* f) {
    fprintf(out, "rank %d:", rank);
    for (int c = 0; c < FIG_NMEM; c++) { fprintf(out, " %s %llu", FIG_MEM_NAMES[c], (unsigned long long)f->mem[c]); }
    fprintf(out, " |");
    for (int c = 0; c < FIG_NCOMM; c++) { fprintf(out, " %s %llu", FIG_COMM_NAMES[c], (unsigned long long)f->bytes[c]); }
    fprintf(out, "\n");
}

// ---------------------------------------------------------------------------------------
// A candidate: the mesh and the settings that change memory or time.

typedef struct {
    int dp, pp, cp, tp, ep;
    int sp, zero, micro;      // micro: micro-batches per step (--grad-accum; the pipeline's m)
    int sched, v;             // pipeline schedule (pp_schedule.h) and chunks per stage
    int recompute;            // RECOMPUTE_NONE, _SELECTIVE, _FULL
} Candidate;

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

// ---------------------------------------------------------------------------------------
// The pieces the trainer shares with the planner: the data-parallel settings and a rank's place.

static inline DPConfig dp_config_from_args(const TrainArgs* a, int pipeline, int experts) {
    DPConfig cfg = {a->dp_mode, a->zero, a->offload, strcmp(a->comm_algo, "ring") == 0, a->ps_servers, a->bucket_mb, ShardGroup{},
                    pipeline, experts,
                    a->qwz, a->hpz, a->qgz,   // ZeRO++ on ZeRO-3 (llmc/parallel/dp_zeropp.h)
                    a->comm_chunk_kb, strcmp(a->comm_order, "priority") == 0,   // layer-wise scheduling (dp_priority.h)
                    a->ps_async, a->staleness_bound,                            // (a)synchronous server (dp_ps_async.h)
                    a->straggler && strncmp(a->straggler, "hold:", 5) == 0 ? atoi(a->straggler + 5) : -1,
                    a->compress, strcmp(a->error_feedback, "on") == 0};         // compression (dp_compress.h)
    return cfg;
}

// --pp-split "2,4,2": layers per stage (empty: the even split)
static inline std::vector<int> pp_split_parse(const char* text) {
    std::vector<int> split;
    for (const char* s = text; s && *s;) {
        const char* end = s;
        int n = 0;
        if (!parse_count(s, &n, &end) || (*end != ',' && *end != 0)) {
            die("--pp-split must be comma-separated layer counts (whole numbers up to 2147483647), got '%s'", text);
        }
        split.push_back(n);
        s = *end ? end + 1 : end;
    }
    return split;
}

// Which shard of the model the rank at `coord` of a dp x pp x cp x tp mesh holds (llmc/model/params.h)
static inline GPT2Place place_at(const TrainArgs* a, const GPT2Config* cfg, const int size[4], const int coord[4],
                                 const std::vector<int>& split) {
    GPT2Place p = gpt2_place_whole(cfg);
    if (size[MESH_TP] > 1) {
        p.tp = size[MESH_TP];
        p.tp_rank = coord[MESH_TP];
        p.sp = a->sp;
    }
    if (size[MESH_PP] > 1) {   // the stage's layers (and chunks), the embedding first, the head last
        const int* s = split.empty() ? NULL : split.data();
        pp_check_layers(cfg->num_layers, size[MESH_PP], a->pp_chunks, s, (int)split.size());
        pp_stage_place(&p, cfg->num_layers, size[MESH_PP], a->pp_chunks, s, coord[MESH_PP]);
    }
    if (a->ep > 1) {   // ep groups of consecutive dp ranks: rank j of a group holds experts [j E/ep, ...)
        p.ep = a->ep;
        p.ep_rank = coord[MESH_DP] % a->ep;
    }
    return p;
}

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
    GPT2Place place = place_at(a, cfg, size, coord, split);
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
// The machine: memory, peak, and the two links (inside a node, between nodes).

typedef struct {
    std::string name;
    double mem;                // bytes per device
    double peak, eff;          // FLOP/s per device, and the share the kernels reach
    int per_node;
    double alpha[2], bw[2];    // seconds per message, bytes per second: [0] inside a node, [1] between
    int cores;                 // cpu: the cores the devices share
} Machine;

// A links file (collbench measures the values), read as strictly as the flags: each line
// "intra|inter ALPHA_US GB_PER_S" (blank lines and # comments aside), each number whole ("25x"
// is not 25), each link at most once; an error names the file and the line.
static inline void machine_read_links(Machine* m, const char* path) {
    FILE* f = fopen_or_die(path, "r");
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) { text.append(buf, got); }
    fclose(f);
    int line_no = 0, first[2] = {0, 0};
    for (size_t at = 0; at < text.size();) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) { end = text.size(); }
        std::string line = text.substr(at, end - at);
        at = end + 1;
        line_no++;
        std::vector<std::string> words;
        for (size_t i = 0; i < line.size();) {
            while (i < line.size() && isspace((unsigned char)line[i])) { i++; }
            size_t j = i;
            while (j < line.size() && !isspace((unsigned char)line[j])) { j++; }
            if (j > i) { words.push_back(line.substr(i, j - i)); }
            i = j;
        }
        if (words.empty() || words[0][0] == '#') { continue; }
        double v[2] = {-1.0, -1.0};
        for (int i = 0; i < 2 && i + 1 < (int)words.size(); i++) {
            char* e = NULL;
            v[i] = strtod(words[i + 1].c_str(), &e);
            if (*e != 0 || !isfinite(v[i])) { v[i] = -1.0; }
        }
        int k = words[0] == "inter";
        if (words.size() != 3 || (words[0] != "intra" && words[0] != "inter") || !(v[0] >= 0) || !(v[1] > 0)) {
            die("--links '%s', line %d: '%s' is not 'intra|inter ALPHA_US GB_PER_S' (alpha >= 0 us, bandwidth > 0 GB/s)", path,
                line_no, line.c_str());
        }
        if (first[k]) { die("--links '%s', line %d: the %s link again (first on line %d)", path, line_no, words[0].c_str(), first[k]); }
        first[k] = line_no;
        m->alpha[k] = v[0] * 1e-6;
        m->bw[k] = v[1] * 1e9;
    }
    if (!first[0] && !first[1]) { die("--links '%s' has no 'intra|inter ALPHA_US GB_PER_S' line", path); }
}

static inline Machine machine_from_args(const TrainArgs* a, int devices) {
    Machine m;
#ifdef LLMC_CPU
    const char* name = a->machine ? a->machine : "cpu";
#else
    const char* name = a->machine ? a->machine : "h100";
#endif
    m.name = name;
    m.cores = 0;
    if (strcmp(name, "h100") == 0) {   // H100 SXM 80 GB nodes of 8: NVLink 4 (~360 GB/s a direction reached), 400 Gb/s NDR per GPU
        m.mem = 80.0 * 1073741824.0;
        m.peak = 989e12;   // bf16 dense
        m.eff = 0.40;
        m.per_node = 8;
        m.alpha[0] = 5e-6; m.bw[0] = 360e9;
        m.alpha[1] = 10e-6; m.bw[1] = 45e9;
    } else {   // this machine: the devices are ranks sharing its cores and memory, one "node"
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE), cores = sysconf(_SC_NPROCESSORS_ONLN);
        m.cores = cores > 0 ? (int)cores : 1;
        m.mem = (double)pages * page / std::max(1, devices);
        m.peak = 10e9 * std::min(1.0, (double)m.cores / std::max(1, devices));   // fp32 GFLOP/s of a core, shared
        m.eff = 1.0;
        m.per_node = std::max(1, devices);
        m.alpha[0] = m.alpha[1] = 30e-6; m.bw[0] = m.bw[1] = 2e9;   // shared-memory MPI (measure with collbench: --links)
    }
    if (a->device_mem > 0) { m.mem = a->device_mem * 1073741824.0; }
    if (a->peak_tflops > 0) {
        m.peak = a->peak_tflops * 1e12;
        if (m.cores) { m.peak *= std::min(1.0, (double)m.cores / std::max(1, devices)); }   // a core's peak, shared by the ranks
    }
    if (a->efficiency > 0) { m.eff = a->efficiency; }
    if (a->per_node > 0) { m.per_node = a->per_node; }
    if (a->links) { machine_read_links(&m, a->links); }
    return m;
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
        p->comm[k] = msgs[k] * mc->alpha[inter] + p->worst.bytes[k] / mc->bw[inter];
    }
    double backward = p->compute * 2.0 / 3.0;
    double dp_exposed = std::max(p->comm[FIG_DP] - backward, p->comm[FIG_DP] / std::max<size_t>(1, rp->buckets));
    double attention = p->compute * (12.0 * L * C * T) / gpt2_flops_per_token(&whole, a->seq);   // the attention core's share
    double cp_exposed = std::max(0.0, p->comm[FIG_CP] - attention);
    p->exposed = dp_exposed + cp_exposed + p->comm[FIG_TP] + p->comm[FIG_PP] + p->comm[FIG_PP_EMBED] + p->comm[FIG_EP] + p->comm[FIG_EDP];
    p->step = p->compute + p->bubble + p->exposed;
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
        std::vector<int> split = pp_split_parse(a.pp_split);
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

// ---------------------------------------------------------------------------------------
// What it prints

static inline double gib(double b) { return b / 1073741824.0; }

static inline void planner_print_header(const TrainArgs* a, const GPT2Config* cfg, int devices, const Machine* mc) {
    printf("planner      %s: %d layers, %d heads, C %d, V %d%s; batch %d x %d tokens; %s floatX (%zu bytes)\n",
           a->load ? a->load : a->model, cfg->num_layers, cfg->num_heads, cfg->channels, cfg->vocab_size,
           gpt2_is_moe(cfg) ? (", " + std::to_string(cfg->num_experts) + " experts top-" + std::to_string(cfg->moe_topk)).c_str() : "",
           a->batch, a->seq, BACKEND_NAME, sizeof(floatX));
    printf("machine      %s: %d devices, %d per node, %.2f GiB each, peak %.3g TFLOP/s x efficiency %.2f, "
           "links %.0f us + %.1f GB/s inside a node, %.0f us + %.1f GB/s between\n", mc->name.c_str(), devices, mc->per_node,
           gib(mc->mem), mc->peak / 1e12, mc->eff, mc->alpha[0] * 1e6, mc->bw[0] / 1e9, mc->alpha[1] * 1e6, mc->bw[1] / 1e9);
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

// --plan: no training, one process
static inline int planner_main(const TrainArgs* a) {
    int version;
    GPT2Config cfg = gpt2_config_from_args(a, &version);
    if (strcmp(a->plan, "this") == 0) {
        int world = (a->dp ? a->dp : 1) * a->tp * a->pp * a->cp;
        Machine mc = machine_from_args(a, world);
        return planner_this(a, &cfg, world, &mc);
    }
    int devices = a->devices ? a->devices : 8;
    Machine mc = machine_from_args(a, devices);
    PlanResult res = planner_run(a, &cfg, devices, &mc);
    const Prediction* best = planner_report(a, &cfg, devices, &mc, res);
    return best ? 0 : 1;
}

// --mesh auto (every rank alike, rank 0 prints): the best that fits on the ranks mpirun started,
// written into the flags
static inline void planner_choose(TrainArgs* a, int world) {
    int version;
    GPT2Config cfg = gpt2_config_from_args(a, &version);
    Machine mc = machine_from_args(a, world);
    PlanResult res = planner_run(a, &cfg, world, &mc);
    const Prediction* best = planner_report(a, &cfg, world, &mc, res);
    if (!best) { die("--mesh auto: no mesh of the %d ranks runs this model and batch (the planner's answer is above)", world); }
    const Candidate* c = &best->c;
    a->dp = c->dp; a->pp = c->pp; a->cp = c->cp; a->tp = c->tp; a->ep = c->ep;
    a->sp = c->sp; a->zero = c->zero; a->grad_accum = c->micro;
    a->pp_schedule = c->pp > 1 ? pp_schedule_name(c->sched) : "1f1b";
    a->pp_chunks = c->pp > 1 ? c->v : 1;
    a->recompute = gpt2_recompute_name(c->recompute);
    printf("mesh auto    chose %s\n", candidate_flags(c).c_str());
}
