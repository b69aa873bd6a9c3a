// Which shard of the model a rank holds, from its coordinates on the mesh (llmc/parallel/mesh.h)
// and the shard rules of the parameter table (llmc/model/params.h: GPT2Place):
//
//   tp    the matrices, heads and vocabulary split tp ways: shard tp_rank of each
//         (with sp also the residual stream's tokens, T/tp per rank)
//   pp    the stage's layers (and with v interleaved chunks, v runs of them); the
//         embedding on the first stage, the final layernorm and the head on the last
//   ep    groups of ep consecutive data-parallel ranks: rank j of a group holds experts
//         [j E/ep, (j+1) E/ep) of every MoE block
//   dp, cp  the same shard on each of their ranks (cp splits the tokens, not the weights;
//           ZeRO shards the optimizer's copy of it: llmc/parallel/dp.h)
//
// The trainer asks it for its own rank (plan_place); the planner asks it for every rank of a
// candidate mesh, without building anything. Every rank runs the same checks
// (pp_check_layers), so every rank reports a mesh that does not split the model.
#pragma once

#include <vector>
#include "../common.h"
#include "../model/params.h"
#include "mesh.h"
#include "pp_setup.h"

// What the split needs beyond the mesh's sizes
typedef struct {
    int sp;       // sequence parallelism with tp
    int chunks;   // model chunks per pipeline stage (v: 1, or more with the interleaved schedule)
    int ep;       // expert-parallel ranks (1: every rank holds every expert)
} PlaceConfig;

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

// The shard the rank at `coord` of a dp x pp x cp x tp mesh of `size` holds
static inline GPT2Place place_at(const PlaceConfig* pc, const GPT2Config* cfg, const int size[4], const int coord[4],
                                 const std::vector<int>& split) {
    GPT2Place p = gpt2_place_whole(cfg);
    if (size[MESH_TP] > 1) {
        p.tp = size[MESH_TP];
        p.tp_rank = coord[MESH_TP];
        p.sp = pc->sp;
    }
    if (size[MESH_PP] > 1) {   // the stage's layers (and chunks), the embedding first, the head last
        const int* s = split.empty() ? NULL : split.data();
        pp_check_layers(cfg->num_layers, size[MESH_PP], pc->chunks, s, (int)split.size());
        pp_stage_place(&p, cfg->num_layers, size[MESH_PP], pc->chunks, s, coord[MESH_PP]);
    }
    if (pc->ep > 1) {   // ep groups of consecutive dp ranks: rank j of a group holds experts [j E/ep, ...)
        p.ep = pc->ep;
        p.ep_rank = coord[MESH_DP] % pc->ep;
    }
    return p;
}
