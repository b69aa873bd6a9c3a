// Data parallelism: the trainer's entry points. One optimizer step on N ranks:
//   dp_zero_grad                  start of the step
//   for each micro-step:          (the step, llmc/model/step.h)
//     forward, loss, backward     the mode's placement hooks run inside: micro_begin says
//                                 whether this backward communicates, the bucket hooks hand
//                                 ready gradients to the communication thread
//   dp_update                     wait for the gradients, clip, AdamW on what this rank owns,
//                                 bring the parameters back in sync
//   dp_report_step                the bytes this rank sent against the formula, the time
// Around evaluation and checkpoints: dp_full_model_begin / dp_full_model_end (ZeRO-3 gathers).
// Every entry point calls the chosen mode's table (DPModeOps, dp_mode.h); the modes, each in
// its own file with its memory and traffic formulas:
//   naive            dp_naive.h     bucketed DDP   dp_ddp.h     parameter server  dp_ps.h
//   ZeRO-1, 2        dp_zero.h      ZeRO-3         dp_zero3.h   ZeRO-Offload      offload.h
//   ZeRO++           dp_zeropp.h
// and what they share: dp_core.h (state, memory accounting, communication thread), dp_mode.h
// (the tables), dp_update.h (the update of what a rank owns), bucket_layout.h (the gradient
// buckets and each rank's shard), buckets.h (their hooks), dp_accounting.h (the formulas).
// Each rank's gradient is the mean over its own B/N sequences (dloss = 1 / (its tokens)); the
// collectives average over ranks, so the update sees the mean over the global batch, exactly
// as on one rank.
#pragma once

#include <string.h>
#include "dp_core.h"
#include "dp_mode.h"
#include "dp_compress.h"   // before dp_ps.h: its push calls compress_ps_push
#include "dp_compress_accounting.h"
#include "dp_naive.h"
#include "dp_ddp.h"
#include "dp_ps.h"
#include "dp_zero.h"
#include "dp_zero3.h"
#include "dp_zeropp_accounting.h"   // ZeRO++ (dp_zeropp.h) and its formulas, plan and report
#include "offload.h"
#include "dp_priority.h"
#include "dp_ps_async.h"

// What the flags ask for (--dp-mode, --zero, --offload, --comm-algo, --ps-servers, --bucket-mb,
// and ZeRO-3's ZeRO++ options --qwz, --hpz, --qgz)
typedef struct {
    const char* mode;     // "naive", "ddp" or "ps"
    int zero;             // ZeRO stage 0-3 (with "ddp")
    int offload;          // ZeRO-1/2: optimizer state and update in host memory
    int use_ring;         // 1: our ring collectives (bytes counted), 0: the native ones
    int ps_servers;       // parameter server: ranks 0 .. S-1 serve
    double bucket_mb;     // gradient bucket size in MiB
    ShardGroup shards;    // the ranks with the other shards of this replica (tensor, pipeline parallelism), or none
    int defer_root;       // pipeline: the root's gradients are reduced when dp_root_done says so
    int skip_experts;     // expert parallelism: the expert tensors are owned by ep (llmc/parallel/ep.h)
    int qwz;              // ZeRO++ (with ZeRO-3, dp_zeropp.h): weights all-gathered as int8 blocks
    int hpz;              //   the backward's all-gather within groups of hpz ranks (0: off)
    int qgz;              //   gradients reduce-scattered as qgz-bit blocks over an all-to-all (0: off)
    int chunk_kb;         // layer-wise scheduling (dp_priority.h): chunks of this many KiB (0: whole buffers)
    int priority;         //   1: the chunks by priority (first layers first), 0: first come, first served
    int ps_async;         // asynchronous parameter server (dp_ps_async.h)
    int staleness;        //   stale synchronous: at most this many steps ahead of the slowest (-1: not asked for)
    int held;             //   --straggler hold:RANK: the server serves this rank last (-1: none)
    const char* compress; // gradient compression (dp_compress.h): "none", "topk:R", "randk:R", "qsgd:B", "sign"
    int error_feedback;   //   1: what was not sent is added to the next step's gradient
    int comm_auto;        // --comm-algo auto (llmc/comm/auto.h): per call, the tuning file's or the formulas' choice
} DPConfig;

static const DPModeOps* const DP_MODES[] = {&DP_MODE_NAIVE, &DP_MODE_DDP, &DP_MODE_PS,
                                            &DP_MODE_ZERO1, &DP_MODE_ZERO2, &DP_MODE_ZERO3};

// The mode's table for the flags (parse_train_args has already checked the flags themselves
// and their combinations, on every rank).
static inline const DPModeOps* dp_mode_find(const DPConfig* cfg) {
    if (cfg->chunk_kb > 0) { return strcmp(cfg->mode, "ps") == 0 ? &DP_MODE_PS_SCHED : &DP_MODE_DDP_SCHED; }   // layer-wise (dp_priority.h)
    if (cfg->ps_async || cfg->staleness >= 0) { return &DP_MODE_PS_ASYNC; }   // no barrier (dp_ps_async.h)
    if (cfg->qwz || cfg->hpz || cfg->qgz) { return &DP_MODE_ZEROPP; }   // ZeRO-3 with ZeRO++'s collectives (dp_zeropp.h)
    for (const DPModeOps* m : DP_MODES) {
        if (strcmp(m->flag, cfg->mode) == 0 && m->zero == cfg->zero) { return m; }
    }
    die("no data-parallel mode for --dp-mode %s --zero %d", cfg->mode, cfg->zero);
    return NULL;
}

// Collective over `comm` (the data-parallel group): allocates what the mode keeps, replaces the
// model's buffers it shards, installs the mode's hooks in the model's chain, and starts the
// communication thread.
// The fields the formulas read (dp_formula_memory, dp_formula_bytes) for rank `rank` of N, no
// memory, no thread: dp_init starts here, and the planner (llmc/planner/cost_model.h) stops here
// (plus the buckets' layout, buckets_layout).
static inline void dp_shape(DataParallel* dp, GPT2* model, int N, int rank, const DPConfig* cfg) {
    const DPModeOps* ops = dp_mode_find(cfg);
    if (strcmp(cfg->mode, "ps") == 0 && cfg->ps_servers > N) {
        die("--ps-servers %d: at most the %d data-parallel ranks can be servers", cfg->ps_servers, N);
    }
    memset(dp->mem_live, 0, sizeof(dp->mem_live));
    memset(dp->mem_peak, 0, sizeof(dp->mem_peak));
    dp->host_live = 0;
    dp->offload_scratch = NULL;
    dp->own_flat_offset = dp->own_flat_count = 0;
    dp->flat_m = dp->flat_v = dp->flat_master = NULL;
    dp->num_units = 0;
    dp->root_unit = -1;
    dp->one_unit_per_bucket = 0;
    dp->sync = 1;
    dp->materialized = 0;
    dp->hooks = GPT2Hooks{};
    dp->enqueued = dp->completed = 0;
    dp->done.assign(64, 0);
    dp->agree_order = 0;
    dp->stop = 0;
    dp->comm_seconds = dp->exposed_seconds = 0.0;
    dp->step_bytes_start = 0;
    dp->ops = ops;
    dp->opt = cfg->offload ? &DP_OPTIMIZER_HOST : &DP_OPTIMIZER_DEVICE;
    dp->offload = cfg->offload;
    dp->use_ring = cfg->use_ring;
    dp->comm_auto = cfg->comm_auto;
    dp->ps_servers = cfg->ps_servers;
    dp->bucket_bytes = (size_t)(cfg->bucket_mb * 1048576.0);
    dp->comm = NULL;
    dp->N = N;
    dp->rank = rank;
    dp->model = model;
    dp->shards = cfg->shards;
    dp->root_deferred = cfg->defer_root;
    dp->skip_experts = cfg->skip_experts;
    dp->experts = ExpertOwners{};
    // Psi: the parameters this layer manages, the whole flat buffer or, with expert parallelism,
    // everything before the expert tensors (they come last in the table)
    dp->psi = cfg->skip_experts ? model->param_info[FIRST_EXPERT_TENSOR].offset : model->num_parameters;
    dp->psi_pad = dp->psi;
    dp->gather_params = NULL;
    dp->zeropp = NULL;
    dp->sched = NULL;
    dp->async = NULL;
    dp->compress = NULL;
}

static inline void dp_init(DataParallel* dp, GPT2* model, Comm* comm, const DPConfig* cfg) {
    dp_shape(dp, model, comm->size, comm->rank, cfg);
    dp->comm = comm;
    dp->threads = backend_num_threads();
    dp->thread = std::thread(dp_thread_main, dp);
    // the model's own buffers count too
    size_t a = sizeof(floatX);
    dp->mem_live[MEM_PARAMS] = dp->psi * a;
    dp->mem_live[MEM_GRADS] = dp->psi * a;
    dp->mem_live[MEM_ACTS] = model->acts_bytes;
    zeropp_create(dp, cfg->qwz, cfg->hpz, cfg->qgz);   // ZeRO++'s checks and hpZ's group (nothing without its flags)
    sched_create(dp, cfg->chunk_kb, cfg->priority);   // layer-wise scheduling (nothing without --comm-chunk-kb)
    ps_async_create(dp, cfg->ps_async, cfg->staleness, cfg->held);   // the asynchronous server's settings (nothing without its flags)
    dp->ops->init(dp);
    compress_create(dp, cfg->compress, cfg->error_feedback);   // gradient compression, on the mode's buckets (nothing without --compress)
    if (dp->opt->prepare) { dp->opt->prepare(dp); }
    for (int c = 0; c < MEM_NCAT; c++) { dp->mem_peak[c] = dp->mem_live[c]; }
}

static inline void dp_zero_grad(DataParallel* dp) {
    dp->ops->zero_grad(dp);
    dp->comm_seconds = 0.0;
    dp->exposed_seconds = 0.0;
    dp->step_bytes_start = dp->comm->bytes_sent;
}

// After the last micro-step's backward. Returns the gradient norm before clipping.
static inline float dp_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_clip) {
    return dp->ops->update(dp, lr, beta1, beta2, eps, weight_decay, grad_clip);
}

// Communication still in flight after a step (the layer-wise pulls, dp_priority.h) finishes: before
// the training state is saved, and after the last step (before the model is freed)
static inline void dp_settle(DataParallel* dp) {
    if (dp->sched && dp->ops == &DP_MODE_PS_SCHED) { ps_sched_settle(dp); } else { dp_wait_all(dp); }
}

// Evaluation, sampling and checkpoints read the whole model: ZeRO-3 gathers it first
static inline void dp_full_model_begin(DataParallel* dp) {
    if (dp->ops->full_model_begin) { dp->ops->full_model_begin(dp); }
}
static inline void dp_full_model_end(DataParallel* dp) {
    if (dp->ops->full_model_end) { dp->ops->full_model_end(dp); }
}

// ---------------------------------------------------------------------------------------
// What the lecture predicts, to print next to what was measured.

// bytes this rank sends in one optimizer step of `micro` micro-steps, with our ring collectives
static inline uint64_t dp_formula_bytes(const DataParallel* dp, int micro) {
    if (dp->N == 1) { return 0; }
    if (dp->compress) { return compress_formula_bytes(dp); }   // the compressed payloads (dp_compress.h)
    return dp->ops->formula_bytes(dp, micro);
}

// bytes per category that the lecture's table gives for this rank
static inline void dp_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    dp->ops->formula_memory(dp, out);
    compress_formula_memory(dp, out);   // --compress: residuals and wire, in comm buffers
}

static inline const char* mib(size_t bytes, char* buf) {
    snprintf(buf, 32, "%9.3f MiB", bytes / 1048576.0);
    return buf;
}

// The memory table: measured (from the DP layer's allocator accounting) against the formula.
// Every rank checks its own row; rank 0 prints. Returns 1 when all ranks match.
static inline int dp_print_memory(DataParallel* dp) {
    size_t f[MEM_NCAT];
    dp_formula_memory(dp, f);
    int ok = 1;
    for (int c = 0; c <= MEM_ACTS; c++) { if (dp->mem_live[c] != f[c]) { ok = 0; } }
    int all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, dp->comm->mpi);
    char b1[32], b2[32];
    const char* K = BACKEND_MASTER_WEIGHTS || dp->offload ? "12 (master, m, v)" : "8 (m, v)";
    printf("data parallel %s on %d ranks%s: Psi = %zu parameters (%zu padded), a = %zu bytes, K = %s\n",
           dp->ops->name, dp->N, strcmp(dp->comm->name, "dp x cp") == 0 ? " (the dp x cp group)" : "", dp->psi, dp->psi_pad,
           sizeof(floatX), K);
    if (!dp->buckets.empty()) {
        printf("buckets      %zu (", dp->buckets.size());
        for (size_t b = 0; b < dp->buckets.size(); b++) {
            printf("%s%.2f MiB", b ? ", " : "", dp->buckets[b].padded * sizeof(floatX) / 1048576.0);
        }
        const char* note = dp->root_unit >= 0 ? " one per block + root" : " one per block";
        printf(")%s\n", dp->one_unit_per_bucket ? note : "");
    }
    printf("memory per rank (rank %d)   measured        formula\n", dp->rank);
    for (int c = 0; c < MEM_NCAT - 1; c++) {
        printf("  %-18s %s  %s\n", MEM_NAMES[c], mib(dp->mem_live[c], b1), mib(f[c], b2));
    }
    if (dp->offload) { printf("  %-18s %s  (host memory: master, m, v)\n", "offloaded", mib(dp->host_live, b1)); }
    printf("memory check %s (measured %s formula on all %d ranks)\n", all_ok ? "ok" : "FAILED", all_ok ? "=" : "!=", dp->N);
    return all_ok;
}

// The collectives this run uses (printed once at start, after the memory table)
static inline void dp_print_plan(const DataParallel* dp) {
    const char* ours = dp->comm_auto ? "auto (ours, chosen per call by size: llmc/comm/auto.h; bytes counted)" : "ring (ours: bytes counted)";
    printf("comm         %s collectives%s\n", dp->use_ring ? ours : "native MPI (bytes not counted)", dp->ops->comm_note);
    zeropp_print_plan(dp);
    sched_print_plan(dp);
    compress_print_plan(dp);
}

// After a step: the transient buffers' peak (ZeRO-2 buckets in flight, ZeRO-3 gathered blocks)
static inline void dp_print_peaks(const DataParallel* dp) {
    char b1[32], b2[32];
    printf("in flight    gradient buffers peak %s | gathered/comm buffers peak %s\n",
           mib(dp->mem_peak[MEM_GRADS], b1), mib(dp->mem_peak[MEM_COMM], b2));
}

// Communication of the step that just ended: counted bytes against the formula, time.
// (ZeRO++'s hpZ sends on a communicator of its own: its bytes are added)
static inline uint64_t dp_step_bytes(const DataParallel* dp) {
    return dp->comm->bytes_sent - dp->step_bytes_start + zeropp_group_bytes(dp);
}

// The line under each step line (step: 0-based, micro: micro-steps per step); after the first
// step also the transient buffers' peak.
static inline void dp_report_step(DataParallel* dp, int step, int micro) {
    uint64_t sent = dp_step_bytes(dp), want = dp_formula_bytes(dp, micro);
    sched_step_bytes(dp, step, &sent, &want);   // layer-wise pulls belong to the step after their update
    char a[32], b[32];
    if (dp->use_ring || dp->ops->always_counted) {
        printf("     comm | sent %s by this rank (formula %s, %s) | %.1f ms, exposed %.1f ms\n", mib(sent, a),
               mib(want, b), sent == want ? "equal" : "DIFFERENT", dp->comm_seconds * 1e3, dp->exposed_seconds * 1e3);
    } else {
        printf("     comm | native MPI: bytes not counted (ring formula %s) | %.1f ms, exposed %.1f ms\n",
               mib(want, b), dp->comm_seconds * 1e3, dp->exposed_seconds * 1e3);
    }
    zeropp_report_step(dp, micro);   // ZeRO++: bytes per collective against its formula, error bounds
    sched_report_step(dp, step);     // layer-wise scheduling: when the next forward could start
    compress_report_step(dp, sent, want);   // --compress: bytes on every rank, error feedback's conservation
    if (step == 0) { dp_print_peaks(dp); }
}

// Stops the communication thread and frees what dp_init allocated (the model's own buffers are
// gpt2_free's).
static inline void dp_shutdown(DataParallel* dp) {
    {
        std::lock_guard<std::mutex> lock(dp->mu);
        dp->stop = 1;
    }
    dp->cv.notify_all();
    dp->thread.join();
    ps_async_free(dp);   // the asynchronous server: goodbyes, its thread joined
    zeropp_free(dp);
    sched_free(dp);
    compress_free(dp);
    for (Bucket& b : dp->buckets) {
        device_free(b.grad);
        device_free(b.grad_shard);
        device_free(b.param_shard);
        dp->opt->release(b.m);
        dp->opt->release(b.v);
        if (b.master) { dp->opt->release(b.master); }
    }
    if (dp->flat_m) { dp->opt->release(dp->flat_m); dp->opt->release(dp->flat_v); }
    if (dp->flat_master) { dp->opt->release(dp->flat_master); }
    for (auto& entry : dp->pool) { device_free(entry.second); }
    free(dp->offload_scratch);
    dp->buckets.clear();
    dp->pool.clear();
    dp->segments.clear();
}
