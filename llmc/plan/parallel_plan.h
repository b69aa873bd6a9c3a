// The run's parallel plan: everything about how this run is spread over ranks, built once from
// the mesh and the flags, so that the trainer (train_gpt2.cu) never asks which build or which
// mesh it is in. The strategies under llmc/parallel/ read no flags: this file is where the
// flags reach them (llmc/plan/parallel_config.h fills their configs).
//
//   flags ──> plan_init: MPI (or the one-process stand-in, llmc/comm/mpi_single.h), the world,
//             the mesh dp x pp x cp x tp (llmc/parallel/mesh.h; --mesh auto: the planner's
//             choice, handed in by main), this rank's GPU, one voice
//   model ──> plan_place: the model's place in the mesh (llmc/parallel/placement.h: which shard)
//         ──> plan_attach: the placement hooks (data parallelism's mode: llmc/parallel/dp.h), the
//             step (llmc/model/step.h: gradient accumulation by default), the ops
//             (llmc/model/ops.h: defaults)
//   then per training step: plan_zero_grad, plan.step.run (micro-batches), plan_update (clip,
//   AdamW on what this rank owns, parameters back in sync), plan_mean (the loss over ranks)
//
// On one rank the plan is the identity: no hooks, the model's own update, communicators of
// size 1. A strategy that arrives later adds its file under llmc/parallel/ and is wired in
// here (plan_attach), not in main: tensor parallelism replaces ops entries and sets the
// model's place, the pipeline replaces the step, context parallelism replaces the attention op
// and wraps the step (each rank's part of every sequence), data parallelism installs hooks.
// What the plan prints and reports (memory, mesh, bytes per step, --plan-check, the trace) is
// in llmc/train/parallel_plan_report.h.
#pragma once

#include <string>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../model/checkpoint.h"
#include "../model/fp8_linear.h"
#include "../comm/comm.h"
#include "../parallel/mesh.h"
#include "../parallel/placement.h"
#include "../parallel/dp.h"
#include "../parallel/tp.h"
#include "../parallel/tp_accounting.h"
#include "../parallel/tp_zero_bubble.h"
#include "../parallel/pp.h"
#include "../parallel/pp_setup.h"
#include "../parallel/pp_accounting.h"
#include "../parallel/cp.h"
#include "../parallel/ep.h"
#include "../model/step.h"
#include "train_args.h"
#include "parallel_config.h"

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
    Fp8 fp8;                // --fp8: the blocks' linear entries wrapped in FP8 quantisation (llmc/model/fp8_linear.h)
    GPT2* model;
    GPT2Step step;          // the order of the passes over micro-batches
    float beta1, beta2, eps, weight_decay, clip;   // AdamW's and the clipping's, from the flags (plan_update)
    double comm_total, exposed_total;   // data-parallel communication over the timed steps
    size_t mem_start[MEM_NCAT];         // the data-parallel memory table's measured figures (for --plan-check)
} Plan;

// Flags that need the data-parallel layer even on one rank
static inline int plan_wants_dp(const TrainArgs* a) {
    return a->dp > 1 || a->zero > 0 || strcmp(a->dp_mode, "ddp") != 0 || a->offload;
}

// --mesh auto: what picks the mesh for the ranks started and writes it into the flags (main
// hands in the planner's planner_choose, llmc/planner/planner.h)
typedef void (*MeshChoice)(TrainArgs* args, int world);

static inline void plan_init(Plan* plan, int* argc, char*** argv, TrainArgs* args, MeshChoice choose_mesh) {
    // (no memset: DataParallel holds C++ members, a thread and queues, already constructed)
    plan->args = args;
    plan->beta1 = args->beta1, plan->beta2 = args->beta2, plan->eps = args->eps;
    plan->weight_decay = args->weight_decay, plan->clip = args->clip;
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
    plan->pp_split = pp_split_parse(args->pp_split);   // --pp-split 2,4,2: layers per stage (llmc/parallel/placement.h)
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
        choose_mesh(args, plan->world_size);
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

// Which shard of the model this rank holds (llmc/model/params_shard.h), asked by gpt2_from_args once the
// model's shape is known. Data parallelism keeps whole replicas; tensor parallelism splits the
// matrices over the mesh's tp group (and with --sp the residual stream's tokens); the pipeline
// will set the stage's layers and its ends. Every rank checks the place (gpt2_place_check
// names what does not divide), so every rank reports a model that does not split.
static inline GPT2Place plan_place(void* ctx, const GPT2Config* cfg) {
    Plan* plan = (Plan*)ctx;
    if (!plan->use_dp) { return gpt2_place_whole(cfg); }   // one rank: the whole model
    PlaceConfig pc = place_config_from_args(plan->args);
    return place_at(&pc, cfg, plan->mesh.size, plan->mesh.coord, plan->pp_split);   // (llmc/parallel/placement.h)
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
    int use_ring = strcmp(a->comm_algo, "native") != 0;   // auto: data parallelism's choice; tp, cp, pp, ep keep the ring
    DPConfig cfg = dp_config_from_args(a, 0, a->ep > 1);   // (llmc/plan/parallel_config.h: the planner's dry ranks fill it too)
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
        if (plan->ntp > 1 && plan->pp.schedule.split_backward) { tp_zero_bubble_attach(&plan->tp); }   // ZB-H1's W pass
        cfg.defer_root = 1;
        plan->step = pp_step(&plan->pp);
    }
    if (plan->ncp > 1) { plan->step = cp_step(&plan->cp, plan->step); }   // each rank's part of every sequence
    if (a->comm_tuning && plan->mesh.dp_cp.size < 2) {   // no collective of auto's: the file would never be read
        die("--comm-tuning '%s': this job's data-parallel group is one rank (dp x cp = 1), so --comm-algo auto never runs: "
            "drop --comm-tuning, or run more ranks", a->comm_tuning);
    }
    if (a->comm_tuning) { comm_tuning_load(&plan->mesh.dp_cp, a->comm_tuning); }   // --comm-algo auto's table (rows for dp x cp ranks)
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
    if (plan->nep > 1) { ep_zero_grad(&plan->ep); }
}

// before a step's passes, outside the step (the trainer calls it, after the task's begin_step: RLVR's
// rollouts are not the step's traffic): the strategies' per-step statistics from zero
static inline void plan_step_begin(Plan* plan) {
    if (plan->ntp > 1) { tp_step_begin(&plan->tp); }
    if (plan->ncp > 1) { cp_step_begin(&plan->cp); }
    if (plan->nep > 1) { ep_step_begin(&plan->ep); }
    if (plan->model->moe) { moe_step_begin(plan->model->moe); }
}

// whether this rank holds the whole model on whole sequences (generation, samples and the
// accuracy eval need it): not with a pipeline, nor with context parallelism
static inline int plan_whole_model(const Plan* plan) { return plan->npp == 1 && plan->ncp == 1 && plan->nep == 1; }

static inline float plan_update(Plan* plan, float lr) {
    const Plan* p = plan;
    if (p->use_dp) { return dp_update(&plan->dp, lr, p->beta1, p->beta2, p->eps, p->weight_decay, p->clip); }
    return gpt2_update(plan->model, lr, p->beta1, p->beta2, p->eps, p->weight_decay, p->clip);
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
