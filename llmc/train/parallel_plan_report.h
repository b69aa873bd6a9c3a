// What the run's parallel plan (llmc/plan/parallel_plan.h) prints and reports, beside what it
// does: before training, the memory table, the mesh and each strategy's plan (plan_print_layout);
// after each step, the bytes each communicator sent against its formula (plan_report_step);
// at the end, the communication time hidden behind compute (plan_print_summary). Also the
// measured figures of --plan-check (the planner's format, llmc/train/rank_figures.h) and the
// trace of every rank (--trace).
#pragma once

#include <string>
#include <vector>
#include "../plan/parallel_plan.h"
#include "rank_figures.h"
#include "../trace.h"
#include "profile_report.h"
#include "../parallel/mesh_nodes.h"

// ---- before training

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
    if (plan->args->profile) { profile_start(plan->rank == 0); }   // --profile: the machine's ceilings, measured
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
    mesh_print_nodes(&plan->mesh);   // on several nodes: which groups cross the link between them
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

// ---- after each step, and at the end

// layernorm gradient elements this rank completes over the tp group before an update (SP)
static inline size_t plan_norm_elems(const Plan* plan) {
    size_t n = 0;
    for (const OptSegment& s : plan->dp.segments) { n += plan->model->param_info[s.tensor].norm ? s.n : 0; }
    return n;
}

// --trace: every rank starts its clock at once
static inline void plan_trace_start(Plan* plan) {
    if (plan->world_size > 1) { MPI_Barrier(MPI_COMM_WORLD); }
    trace_start();
}

// --plan-check FILE: what this rank measured, in the planner's categories (llmc/train/rank_figures.h):
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
    if (plan->rank == 0 && timed_steps > 0) {   // --profile: the table of operations
        profile_print(plan->use_dp ? plan->comm_total / timed_steps : 0.0, plan->use_dp ? plan->exposed_total / timed_steps : 0.0);
    }
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
