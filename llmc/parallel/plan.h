// The plan: everything about how this run is spread over ranks, built once from the mesh and
// the flags, so that the trainer (train_gpt2.cu) never asks which build or which mesh it is in.
//
//   flags ──> plan_init: MPI (or the one-process stand-in, llmc/comm/mpi_single.h), the world,
//             the mesh dp x pp x cp x tp (llmc/parallel/mesh.h), this rank's GPU, one voice
//   model ──> plan_attach: the model's place in the mesh (llmc/model/params.h: which shard), the
//             placement hooks (data parallelism's mode: llmc/parallel/dp.h), the step
//             (llmc/train/step.h: gradient accumulation by default), the ops (llmc/model/ops.h: defaults)
//   then per training step: plan_zero_grad, plan.step.run (micro-batches), plan_update (clip,
//   AdamW on what this rank owns, parameters back in sync), plan_mean (the loss over ranks)
//
// On one rank the plan is the identity: no hooks, the model's own update, communicators of
// size 1. A strategy that arrives later adds its file under llmc/parallel/ and is wired in
// here (plan_attach), not in main: tensor parallelism replaces ops entries and sets the
// model's place, the pipeline replaces the step, context parallelism replaces the attention op
// and wraps the step (each rank's part of every sequence), data parallelism installs hooks.
#pragma once

#include <string>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../model/checkpoint.h"
#include "../train/step.h"
#include "../train/trace.h"
#include "../train/train_args.h"
#include "../comm/comm.h"
#include "mesh.h"
#include "dp.h"
#include "tp.h"
#include "pp.h"
#include "pp_setup.h"
#include "pp_accounting.h"
#include "cp.h"
#include "ep.h"
#include "../model/fp8.h"
#include "../planner/search.h"

typedef struct {
    const TrainArgs* args;
    Comm world;
    int rank, world_size;   // this process in the world
    int use_dp;             // data parallelism's layer is on (several ranks, or a DP flag on one)
    int ndp, dp_rank;       // data-parallel size and this rank's index (1 and 0 without it)
    int ntp;                // tensor-parallel size (1 without it)
    int npp;                // pipeline stages (1 without it)
    int ncp;                // context-parallel ranks (1 without it)
    std::vector<int> pp_split;   // --pp-split: layers per stage (empty: the even split)
    Mesh mesh;
    DataParallel dp;
    TensorParallel tp;      // with ntp > 1: the ops of llmc/parallel/tp.h on the mesh's tp group
    PipelineParallel pp;    // with npp > 1: the schedule's executor (llmc/parallel/pp.h) is the step
    ContextParallel cp;     // with ncp > 1: ring attention (llmc/parallel/cp.h), the step wrapped
    int nep;                // expert-parallel ranks (1 without it)
    ExpertParallel ep;      // with nep > 1: the experts split over ep of the dp ranks (llmc/parallel/ep.h)
    Fp8 fp8;                // --fp8: the blocks' linear entries wrapped in FP8 quantisation (llmc/model/fp8.h)
    GPT2* model;
    GPT2Step step;          // the order of the passes over micro-batches
    double comm_total, exposed_total;   // data-parallel communication over the timed steps
    size_t mem_start[MEM_NCAT];         // the data-parallel memory table's measured figures (for --plan-check)
} Plan;

// Flags that need the data-parallel layer even on one rank
static inline int plan_wants_dp(const TrainArgs* a) {
    return a->dp > 1 || a->zero > 0 || strcmp(a->dp_mode, "ddp") != 0 || a->offload;
}

static inline void plan_init(Plan* plan, int* argc, char*** argv, TrainArgs* args) {
    // (no memset: DataParallel holds C++ members, a thread and queues, already constructed)
    plan->args = args;
    plan->model = NULL;
    plan->use_dp = 0;
    plan->dp_rank = 0;
    plan->comm_total = plan->exposed_total = 0.0;
    memset(&plan->mesh, 0, sizeof(plan->mesh));
    plan->step = step_grad_accum();
    plan->ntp = args->tp;
    plan->npp = args->pp;
    plan->ncp = args->cp;
    plan->nep = args->ep;
    memset(&plan->tp, 0, sizeof(plan->tp));
    plan->pp.comm = NULL;
    if (!comm_mpi_available() && (plan_wants_dp(args) || args->tp > 1 || args->pp > 1 || args->cp > 1 || args->ep > 1)) {
        die("data, tensor, pipeline, context and expert parallelism (--dp, --dp-mode, --zero, --offload, --tp, --pp, --cp, --ep) "
            "need the MPI build: apt-get install libopenmpi-dev, then make");
    }
    plan->pp_split = pp_split_parse(args->pp_split);   // --pp-split 2,4,2: layers per stage (llmc/planner/search.h)
    // The data-parallel communication thread calls MPI while the main thread computes. Alone,
    // the two never call MPI at the same time (MPI_THREAD_SERIALIZED); with tensor or pipeline
    // parallelism the main thread's collectives and messages on the tp and pp groups run while
    // the thread reduces gradients on the dp group, which needs MPI_THREAD_MULTIPLE.
    // So do the parameter server's scheduled chunks (the next forward runs while parameters
    // arrive) and its asynchronous server (a thread of rank 0).
    int multi = args->tp > 1 || args->pp > 1 || args->cp > 1 || args->ep > 1 || args->comm_timeout > 0   // (+ the watchdog: llmc/train/guard.h)
                || args->comm_chunk_kb > 0 || args->ps_async || args->staleness_bound >= 0
                || args->mesh;   // --mesh auto: any of them may be chosen
    int need = multi ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, provided = 0;
    MPI_Init_thread(argc, argv, need, &provided);
    if (provided < need) {
        die("this MPI library does not provide %s%s", need == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED",
            multi ? " (--tp/--pp/--cp/--ep: their messages and the dp collectives run in two threads at once)" : "");
    }
    plan->world = comm_init_world(argc, argv);
    plan->rank = plan->world.rank;
    die_set_rank(plan->world.rank, plan->world.size);   // errors from here on: "error: [rank R] ..."
    plan->world_size = plan->world.size;
    if (plan->rank != 0) {   // one voice: rank 0 prints; errors still reach stderr from every rank
        if (!freopen("/dev/null", "w", stdout)) { die("cannot silence stdout on rank %d", plan->rank); }
    }
    if (args->mesh) {   // --mesh auto: the planner's best for these ranks (every rank computes the same)
        planner_choose(args, plan->world_size);
        plan->ntp = args->tp;
        plan->npp = args->pp;
        plan->ncp = args->cp;
        plan->nep = args->ep;
    }
    plan->use_dp = plan->world_size > 1 || plan_wants_dp(args);
    if (args->plan_check && !plan->use_dp) { die("--plan-check compares a run of several ranks with the planner: start it with mpirun -np N"); }
    int model_ranks = args->tp * args->pp * args->cp;
    if (plan->world_size % model_ranks != 0) {
        die("--tp %d x --pp %d x --cp %d = %d does not divide the %d ranks mpirun started", args->tp, args->pp, args->cp,
            model_ranks, plan->world_size);
    }
    // one GPU per rank of a node (CUDA build): the node-local rank picks it
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, plan->rank, MPI_INFO_NULL, &node);
    int local_rank = 0;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    backend_init(local_rank);
    backend_set_precision(precision_parse(args->precision));   // --precision (llmc/backend.h)
    plan->ndp = 1;
    if (args->ep > 1 && (plan->world_size / model_ranks) % args->ep != 0) {
        die("--ep %d does not divide the %d data-parallel ranks: the ep groups are formed from them", args->ep,
            plan->world_size / model_ranks);
    }
    if (plan->use_dp) {
        plan->mesh = mesh_init(&plan->world, args->dp ? args->dp : plan->world_size / model_ranks, args->pp, args->cp,
                               args->tp);
        plan->ndp = plan->mesh.size[MESH_DP];
        plan->dp_rank = plan->mesh.coord[MESH_DP];
#ifdef LLMC_CUDA_COMM
        // the data-parallel collectives move device buffers: NCCL, or host-staged MPI when ranks
        // share a GPU, on a non-blocking stream of their own (ordered after the compute stream
        // by the event dp_enqueue records, so communication can overlap the backward)
        comm_enable_device(&plan->mesh.dp_cp, 0, 1);
        // the tp collectives run on the compute thread, in order with the kernels around them:
        // a blocking stream (ordered after the compute stream's work), as Megatron's are
        if (args->tp > 1) { comm_enable_device(&plan->mesh.dim[MESH_TP], 0, 0); }
        // the pipeline's messages too: activations and their gradients are device buffers
        if (args->pp > 1) { comm_enable_device(&plan->mesh.dim[MESH_PP], 0, 0); }
        // ring attention's exchanges overlap the attention: a non-blocking stream, ordered after
        // the compute so far by an event before each call (cp_comm_ready)
        if (args->cp > 1) { comm_enable_device(&plan->mesh.dim[MESH_CP], 0, 1); }
#endif
    }
#ifdef _OPENMP
    if (args->threads > 0) { omp_set_num_threads(args->threads); }
#endif
}

// Which shard of the model this rank holds (llmc/model/params.h), asked by gpt2_from_args once the
// model's shape is known. Data parallelism keeps whole replicas; tensor parallelism splits the
// matrices over the mesh's tp group (and with --sp the residual stream's tokens); the pipeline
// will set the stage's layers and its ends. Every rank checks the place (gpt2_place_check
// names what does not divide), so every rank reports a model that does not split.
static inline GPT2Place plan_place(void* ctx, const GPT2Config* cfg) {
    Plan* plan = (Plan*)ctx;
    if (!plan->use_dp) { return gpt2_place_whole(cfg); }   // one rank: the whole model
    return place_at(plan->args, cfg, plan->mesh.size, plan->mesh.coord, plan->pp_split);   // (llmc/planner/search.h)
}

// The tokens per sequence this rank's activations hold: T, or T/cp with context parallelism.
static inline int plan_local_seq(const Plan* plan, int T) { return T / plan->ncp; }

// This rank's micro-batch: the global --batch over micro-steps and data-parallel ranks.
static inline int plan_micro_batch(const Plan* plan) {
    const TrainArgs* a = plan->args;
    if (a->batch % (a->grad_accum * plan->ndp) != 0) {
        die("--batch %d does not split into %d micro-steps x %d data-parallel ranks", a->batch, a->grad_accum, plan->ndp);
    }
    return a->batch / (a->grad_accum * plan->ndp);
}

// The model (built, activations allocated) joins the plan: tensor parallelism's ops, data
// parallelism's placement.
static inline void plan_attach_parallel(Plan* plan, GPT2* model) {
    if (!plan->use_dp) { return; }
    const TrainArgs* a = plan->args;
    int use_ring = strcmp(a->comm_algo, "ring") == 0;
    DPConfig cfg = dp_config_from_args(a, 0, a->ep > 1);   // (llmc/planner/search.h: the planner's dry ranks use it too)
    if (plan->ntp > 1) {   // tensor parallelism: its ops, and the update's sums over the shards
        tp_init(&plan->tp, model, &plan->mesh.dim[MESH_TP], use_ring);
        cfg.shards = tp_shard_group(&plan->tp);
    }
    if (plan->ncp > 1) {   // context parallelism: the attention op, this rank's positions
        cp_init(&plan->cp, model, &plan->mesh.dim[MESH_CP], cp_algo_parse(a->cp_algo), strcmp(a->cp_split, "zigzag") == 0,
                a->seq, use_ring);
    }
    if (plan->npp > 1) {   // the pipeline: the step, its activation slots, the sums over the stages
        pp_init(&plan->pp, model, &plan->mesh.dim[MESH_PP], pp_schedule_parse(a->pp_schedule), a->pp_chunks, a->grad_accum,
                use_ring, cfg.shards);
        cfg.shards = pp_shard_group(&plan->pp);
        cfg.defer_root = 1;
        plan->step = pp_step(&plan->pp);
    }
    if (plan->ncp > 1) { plan->step = cp_step(&plan->cp, plan->step); }   // each rank's part of every sequence
    dp_init(&plan->dp, model, &plan->mesh.dp_cp, &cfg);   // gradients averaged over dp x cp
    memcpy(plan->mem_start, plan->dp.mem_live, sizeof(plan->mem_start));
    if (plan->nep > 1) { ep_init(&plan->ep, model, &plan->mesh.dp_cp, &plan->dp, use_ring); }   // the experts' own group
    if (plan->npp > 1) {   // the tied wte's gradient is reduced over the replicas after the embedding group's sum
        plan->pp.dp = &plan->dp;
        plan->pp.root_done = dp_root_done;
    }
}
static inline void plan_attach(Plan* plan, GPT2* model) {
    plan->model = model;
    plan_attach_parallel(plan, model);
    fp8_attach(&plan->fp8, model, plan->args->fp8, plan->args->fp8_history);   // last: it wraps the strategies' linears
}

// ---- what a training step calls

static inline void plan_zero_grad(Plan* plan) {
    if (plan->use_dp) { dp_zero_grad(&plan->dp); } else { gpt2_zero_grad(plan->model); }
    if (plan->ntp > 1) { tp_step_begin(&plan->tp); }
    if (plan->ncp > 1) { cp_step_begin(&plan->cp); }
    if (plan->nep > 1) { ep_step_begin(&plan->ep); }
    if (plan->model->moe) { moe_step_begin(plan->model->moe); }
}

// whether this rank holds the whole model on whole sequences (generation, samples and the
// accuracy eval need it): not with a pipeline, nor with context parallelism
static inline int plan_whole_model(const Plan* plan) { return plan->npp == 1 && plan->ncp == 1 && plan->nep == 1; }

static inline float plan_update(Plan* plan, float lr) {
    const TrainArgs* a = plan->args;
    if (plan->use_dp) { return dp_update(&plan->dp, lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->clip); }
    return gpt2_update(plan->model, lr, a->beta1, a->beta2, a->eps, a->weight_decay, a->clip);
}

// sum of a value over the data-parallel ranks, the dp x cp group with context parallelism (the
// value itself on one rank)
static inline double plan_sum(Plan* plan, double x) {
    if (plan->use_dp) { MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, plan->dp.comm->mpi); }
    return x;
}
// sum of a value every rank of a batch computed alike (a count over the whole batch): over the
// dp ranks only, not the cp ranks that share the batch
static inline double plan_sum_batches(Plan* plan, double x) {
    if (plan->use_dp) { MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, plan->mesh.dim[MESH_DP].mpi); }
    return x;
}
// the mean over data-parallel (dp x cp) ranks of a per-rank mean (a step's loss)
static inline float plan_mean(Plan* plan, float x) {
    // no barrier (--ps-async, --staleness): no collective either; the step line shows this
    // worker's own loss, which goes to the server with its next request (its --ps-log has the mean)
    if (plan->use_dp && plan->dp.async) { return ps_async_note_loss(&plan->dp, x); }
    return plan->use_dp ? (float)(plan_sum(plan, x) / plan->dp.comm->size) : x;
}
// all-gather n floats from every data-parallel rank, in rank order (a copy on one rank); the
// signature of llmc/tasks/rlvr_rollouts.h's GatherFn with the plan as ctx
static inline void plan_gather_floats(const float* mine, int n, float* all, void* ctx) {
    Plan* plan = (Plan*)ctx;
    if (plan->use_dp) { MPI_Allgather(mine, n, MPI_FLOAT, all, n, MPI_FLOAT, plan->dp.comm->mpi); return; }
    memcpy(all, mine, (size_t)n * sizeof(float));
}

// The ranks that draw the samples: rank 0, and with tensor parallelism the rest of its tp group,
// which computes the other shards of every token (they draw the same numbers; rank 0 prints)
static inline int plan_samples(const Plan* plan) { return plan->dp_rank == 0 && plan_whole_model(plan); }

// Evaluation, sampling and checkpoints want the whole model on this rank (ZeRO-3 gathers it)
static inline void plan_full_model_begin(Plan* plan) { if (plan->use_dp) { dp_full_model_begin(&plan->dp); } }
static inline void plan_full_model_end(Plan* plan) { if (plan->use_dp) { dp_full_model_end(&plan->dp); } }

// The one llm.c checkpoint, written by rank 0 (between plan_full_model_begin and _end). When
// the ranks hold shards (tensor or pipeline parallelism), rank 0 gathers every rank's place
// and flat buffer and puts each slice back into the full model first.
static inline void plan_save_checkpoint(Plan* plan, const char* path) {
    GPT2* m = plan->model;
    int sharded = !gpt2_place_is_whole(&m->place, &m->config);
    MPI_Allreduce(MPI_IN_PLACE, &sharded, 1, MPI_INT, MPI_MAX, plan->world.mpi);
    if (!sharded) {
        if (plan->rank == 0) { gpt2_save_checkpoint(m, path); }
        return;
    }
    int world = plan->world_size, n = (int)m->num_parameters;
    std::vector<float> mine(m->num_parameters);
    copy_floats_to_host(mine.data(), m->params_memory, m->num_parameters);
    std::vector<GPT2Place> places(world);
    std::vector<int> counts(world), displs(world);
    MPI_Gather(&m->place, (int)sizeof(GPT2Place), MPI_BYTE, places.data(), (int)sizeof(GPT2Place), MPI_BYTE, 0,
               plan->world.mpi);
    MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, plan->world.mpi);
    std::vector<float> all;
    if (plan->rank == 0) {
        size_t total = 0;
        for (int r = 0; r < world; r++) { displs[r] = (int)total; total += counts[r]; }
        all.resize(total);
    }
    MPI_Gatherv(mine.data(), n, MPI_FLOAT, all.data(), counts.data(), displs.data(), MPI_FLOAT, 0, plan->world.mpi);
    if (plan->rank != 0) { return; }
    std::vector<float*> locals(world);
    for (int r = 0; r < world; r++) { locals[r] = all.data() + displs[r]; }
    std::vector<float> full(m->num_parameters_full);
    gpt2_full_from_shards(&m->config, places.data(), locals.data(), world, full.data());
    gpt2_save_full_checkpoint(&m->config, full.data(), full.size(), path);
}

// ---- what the trainer prints

static inline void plan_print(Plan* plan) {
    printf("backend      %s, %d threads, %s\n", BACKEND_NAME, backend_num_threads(),
           comm_mpi_available() ? "MPI build" : "built without MPI: single rank only");
    printf("precision    %s parameters, activations and gradients%s\n", precision_name(backend_precision()),
           backend_precision() == PREC_FP32 ? "" : "; fp32 master weights, AdamW moments and every sum");
    fp8_print(&plan->fp8);
}

// The activations this rank allocated (the buffers' sizes) against gpt2_activation_formula for
// the --recompute mode, checked on every rank (collective over the world; rank 0 prints), and
// the lecture's per-layer count (2-byte values, dropout, whole layers) for comparison.
static inline void plan_print_activations(Plan* plan) {
    const GPT2* m = plan->model;
    ActivationFormula f = gpt2_activation_formula(m, m->max_B, m->max_T, m->num_slots);
    int ok = f.total == m->acts_requested;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, plan->world.mpi);
    const char* kept[] = {"the whole block", "the whole block but fch_gelu and the attention state", "residual3 only"};
    printf("activations  recompute %s: %.3f MiB measured %s %.3f MiB formula (%s on all %d ranks): %d slots x %d layers x "
           "%.3f MiB kept (%s) + %.3f MiB scratch + %.3f MiB ends and backward\n", gpt2_recompute_name(m->recompute),
           m->acts_requested / 1048576.0, ok ? "=" : "!=", f.total / 1048576.0, ok ? "equal" : "DIFFERENT", plan->world_size,
           m->num_slots, gpt2_slot_layers(m), f.per_layer / 1048576.0, kept[m->recompute], f.scratch / 1048576.0,
           (f.total - m->num_slots * gpt2_slot_layers(m) * f.per_layer - f.scratch) / 1048576.0);
    double L = (double)m->num_slots * gpt2_slot_layers(m), b = m->max_B, s = m->max_T, h = m->config.channels,
           a = m->config.num_heads, MiB = 1048576.0;
    printf("  lecture    L (34 sbh + 5 a s^2 b) at 2 bytes a value, whole layers: %.3f MiB without recomputation, "
           "L 34 sbh = %.3f MiB selective, L 2 sbh = %.3f MiB full\n", L * (34 * s * b * h + 5 * a * s * s * b) / MiB,
           L * 34 * s * b * h / MiB, L * 2 * s * b * h / MiB);
}

// after the model, batch and task lines: memory, mesh, communication
static inline void plan_print_layout(Plan* plan) {
    GPT2* m = plan->model;
    if (m->moe) { moe_print_plan(m); }
    if (!plan->use_dp) {
        int master = BACKEND_MASTER_WEIGHTS;   // bf16 (CUDA, or the CPU's --precision): fp32 master weights too
        printf("memory       parameters + gradients %.1f MiB, AdamW state%s %.1f MiB, activations %.1f MiB\n",
               2.0 * m->num_parameters * sizeof(floatX) / 1048576.0, master ? " and master weights" : "",
               (master ? 3.0 : 2.0) * m->num_parameters * sizeof(float) / 1048576.0, m->acts_bytes / 1048576.0);
        plan_print_activations(plan);
        return;
    }
    mesh_print(&plan->mesh);
    if (plan->npp > 1) {
        pp_print_plan(&plan->pp, &m->config, plan->pp_split.empty() ? NULL : plan->pp_split.data(), plan->args->pp_print);
        if (plan->args->sample_every > 0) { printf("note: no samples with --pp: generation runs the whole model on one rank\n"); }
    }
    if (plan->ncp > 1) {
        cp_print_plan(&plan->cp);
        cp_print_memory(&plan->cp);
        if (plan->args->sample_every > 0) { printf("note: no samples with --cp: generation runs whole sequences on one rank\n"); }
    }
    if (plan->ntp > 1) { tp_print_memory(&plan->tp); }
    if (plan->npp > 1) { pp_print_memory(&plan->pp); }
    if (plan->nep > 1) {
        ep_print_plan(&plan->ep);
        if (plan->args->sample_every > 0 || plan->args->accuracy > 0) {
            printf("note: no samples or accuracy with --ep: generation runs every expert on one rank\n");
        }
    }
    dp_print_memory(&plan->dp);
    plan_print_activations(plan);
    dp_print_plan(&plan->dp);
    if (plan->ntp > 1) { tp_print_plan(&plan->tp); }
}

// What this rank's optimizer holds, as segments: data parallelism's (its ZeRO block, a server's
// slice, everything with DDP), then the experts' it owns; on one rank, one per tensor of the
// model's own buffers (m, v, master NULL until the first update allocates them). The training
// state saves and fills these; the NaN search reads their gradients.
static inline std::vector<OptSegment> plan_opt_segments(const Plan* plan) {
    std::vector<OptSegment> out;
    GPT2* m = plan->model;
    if (plan->use_dp) {
        out = plan->dp.segments;
        out.insert(out.end(), plan->dp.experts.segments.begin(), plan->dp.experts.segments.end());
        return out;
    }
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &m->param_info[i];
        if (p->numel == 0) { continue; }
        size_t o = p->offset;
        out.push_back({i, m->params_memory + o, m->grads_memory + o, m->m_memory ? m->m_memory + o : NULL,
                       m->v_memory ? m->v_memory + o : NULL, m->master_memory ? m->master_memory + o : NULL, p->numel, o});
    }
    return out;
}

// layernorm gradient elements this rank completes over the tp group before an update (SP)
static inline size_t plan_norm_elems(const Plan* plan) {
    size_t n = 0;
    for (const OptSegment& s : plan->dp.segments) { n += plan->model->param_info[s.tensor].norm ? s.n : 0; }
    return n;
}

static inline void plan_trace_start(Plan* plan) {
    if (plan->world_size > 1) { MPI_Barrier(MPI_COMM_WORLD); }
    trace_start();
}

// --plan-check FILE: what this rank measured, in the planner's categories (llmc/planner/search.h):
// the data-parallel memory table's figures at the start, the expert state, and the bytes each communicator counted in the
// step just reported. Rank 0 gathers every rank's and writes one line per rank.
static inline RankFigures plan_measured(const Plan* plan) {
    RankFigures f;
    memset(&f, 0, sizeof(f));
    size_t a = sizeof(floatX);
    f.mem[FIG_PARAMS] = plan->mem_start[MEM_PARAMS];   // (--plan-check needs the data-parallel layer: plan_init)
    f.mem[FIG_GRADS] = plan->mem_start[MEM_GRADS];
    f.mem[FIG_MASTER] = plan->mem_start[MEM_MASTER];
    f.mem[FIG_OPTIM] = plan->mem_start[MEM_OPTIM];
    f.mem[FIG_ACTS] = plan->mem_start[MEM_ACTS];
    f.bytes[FIG_DP] = dp_step_bytes(&plan->dp);
    if (plan->ntp > 1) { f.bytes[FIG_TP] = tp_step_bytes(&plan->tp); }
    if (plan->npp > 1) {
        f.bytes[FIG_PP] = plan->pp.comm->bytes_sent - plan->pp.bytes_start;
        f.bytes[FIG_PP_EMBED] = plan->pp.embed.bytes_sent - plan->pp.embed_bytes_start;
    }
    if (plan->ncp > 1) { f.bytes[FIG_CP] = plan->cp.comm->bytes_sent - plan->cp.step_bytes_start; }
    if (plan->nep > 1) {
        f.mem[FIG_EXPERTS] = plan->ep.count * a + plan->ep.bytes_state;
        f.bytes[FIG_EP] = plan->ep.comm.bytes_sent - plan->ep.step_start;
        f.bytes[FIG_EDP] = plan->ep.edp.bytes_sent - plan->ep.edp_start;
    }
    return f;
}
static inline void plan_write_check(const Plan* plan, const char* path) {
    RankFigures mine = plan_measured(plan);
    std::vector<RankFigures> all(plan->world_size);
    MPI_Gather(&mine, (int)sizeof(mine), MPI_BYTE, all.data(), (int)sizeof(mine), MPI_BYTE, 0, plan->world.mpi);
    if (plan->rank != 0) { return; }
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    for (int r = 0; r < plan->world_size; r++) { figures_print(f, r, &all[r]); }
    fclose_and_rename(f, tmp, path);
    printf("plan check   every rank's memory and bytes of step %d written to %s\n", plan->args->steps > 1 ? 2 : 1, path);
}

// after each step's line: the communication it did
static inline void plan_report_step(Plan* plan, int step) {
    if (plan->model->moe) { moe_report_step(plan->model, plan->use_dp ? plan->dp.comm->mpi : MPI_COMM_NULL); }
    if (!plan->use_dp) { return; }
    if (step + 1 == plan->args->steps || step + 1 == plan->args->exit_after) { dp_settle(&plan->dp); }   // nothing left in flight
    dp_report_step(&plan->dp, step, plan->args->grad_accum);
    if (plan->ntp > 1) {
        const GPT2* m = plan->model;
        tp_report_step(&plan->tp, plan->args->grad_accum, m->acts[0].B, m->acts[0].T, plan_norm_elems(plan));
    }
    if (plan->npp > 1) { pp_report_step(&plan->pp, plan->model->max_B, plan->model->max_T); }
    if (plan->ncp > 1) { cp_report_step(&plan->cp, plan->args->grad_accum, plan->model->max_B); }
    if (plan->nep > 1) { ep_report_step(&plan->ep); }
    if (plan->args->plan_check && step == std::min(1, plan->args->steps - 1)) { plan_write_check(plan, plan->args->plan_check); }
    if (step > 0) { plan->comm_total += plan->dp.comm_seconds; plan->exposed_total += plan->dp.exposed_seconds; }
}

static inline void plan_print_summary(Plan* plan, int timed_steps) {
    backend_precision_report();   // --precision bf16|fp16 on the CPU: values flushed to zero, overflowed
    if (plan->use_dp && plan->dp.async) { ps_async_summary(&plan->dp, plan->args->ps_log); }   // step rates, staleness, --ps-log
    if (!plan->use_dp || timed_steps == 0) { return; }
    sched_print_summary(&plan->dp);   // layer-wise scheduling: when the next forward could start
    double c = plan->comm_total / timed_steps, e = plan->exposed_total / timed_steps;
    printf("communication per step (rank 0): %.1f ms, of which exposed %.1f ms (%.0f%% hidden behind compute)\n", c * 1e3,
           e * 1e3, c > 0 ? 100.0 * (1.0 - std::min(1.0, e / c)) : 0.0);
}

// Rank 0 collects every rank's trace events and writes the one file.
static inline void plan_write_trace(Plan* plan, const char* path) {
    std::string mine = trace_json_events(plan->rank);
    int len = (int)mine.size(), world = plan->world_size;
    std::vector<int> lens(world), displs(world);
    MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<char> all;
    if (plan->rank == 0) {
        size_t total = 0;
        for (int r = 0; r < world; r++) { displs[r] = (int)total; total += lens[r]; }
        all.resize(total + 1);
    }
    MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (plan->rank == 0) {
        std::vector<std::string> parts;
        for (int r = 0; r < world; r++) { parts.push_back(std::string(all.data() + displs[r], lens[r])); }
        trace_write_file(path, parts);
        printf("trace: %s (open it in ui.perfetto.dev)\n", path);
    }
}

// after gpt2_free: the data-parallel layer's buffers, the communicators, the device, MPI
static inline void plan_free(Plan* plan) {
    fp8_free(&plan->fp8);
    if (plan->ntp > 1) { tp_free(&plan->tp); }
    if (plan->npp > 1) { pp_free(&plan->pp); }
    if (plan->ncp > 1) { cp_free(&plan->cp); }
    if (plan->nep > 1) { ep_free(&plan->ep); }
    if (plan->use_dp) {
        dp_shutdown(&plan->dp);
        mesh_free(&plan->mesh);
    }
    comm_free(&plan->world);
    backend_shutdown();
    MPI_Finalize();
}
