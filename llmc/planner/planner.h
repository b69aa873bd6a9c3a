// The planner: which mesh, for this model, batch and machine? (The lecture's slides on
// parallelism strategies, "Deciding on parallelism strategy".) It never runs a step: every
// candidate goes through the trainer's own checks and is costed on dry models (the shapes only)
// with the same functions the trainer prints its memory tables and byte counts with.
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
// The search (enumerate, check, rank): llmc/planner/search.h; what a candidate costs (memory
// and bytes per rank, the step's time): llmc/planner/cost_model.h, on the machine of
// llmc/planner/machine.h; what it prints: llmc/planner/report.h. Below, the two entry points:
// --plan (planner_main, from main) and --mesh auto (planner_choose, which main hands to the
// trainer's plan_init).
#pragma once

#include <string.h>
#include "../plan/train_args.h"
#include "../train/model_from_args.h"
#include "machine.h"
#include "search.h"
#include "report.h"

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
    if (!best) { die("--plan all: no mesh of %d devices runs this model and batch (the lines above say why, and what would)", devices); }
    return 0;
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
