// The flags, as the parallel pieces take them: llmc/parallel/ reads no flags, it takes small
// config structs, filled here from the checked TrainArgs. The trainer's plan
// (llmc/plan/parallel_plan.h) and the planner's dry ranks (llmc/planner/) fill them alike, so
// what the planner predicts is what the run sets up.
#pragma once

#include <string.h>
#include <stdlib.h>
#include "train_args.h"
#include "../parallel/dp.h"
#include "../parallel/placement.h"

// Data parallelism's settings (llmc/parallel/dp.h). pipeline: the root's gradients wait for the
// embedding group's sum; experts: ep owns the expert tensors.
static inline DPConfig dp_config_from_args(const TrainArgs* a, int pipeline, int experts) {
    DPConfig cfg = {a->dp_mode, a->zero, a->offload, strcmp(a->comm_algo, "native") != 0, a->ps_servers, a->bucket_mb, ShardGroup{},
                    pipeline, experts,
                    a->qwz, a->hpz, a->qgz,   // ZeRO++ on ZeRO-3 (llmc/parallel/dp_zeropp.h)
                    a->comm_chunk_kb, strcmp(a->comm_order, "priority") == 0,   // layer-wise scheduling (dp_priority.h)
                    a->ps_async, a->staleness_bound,                            // (a)synchronous server (dp_ps_async.h)
                    a->straggler && strncmp(a->straggler, "hold:", 5) == 0 ? atoi(a->straggler + 5) : -1,
                    a->compress, strcmp(a->error_feedback, "on") == 0,          // compression (dp_compress.h)
                    strcmp(a->comm_algo, "auto") == 0};                         // auto's choice (llmc/comm/auto.h)
    return cfg;
}

// What the placement needs beyond the mesh (llmc/parallel/placement.h)
static inline PlaceConfig place_config_from_args(const TrainArgs* a) {
    PlaceConfig pc = {a->sp, a->pp_chunks, a->ep};
    return pc;
}
