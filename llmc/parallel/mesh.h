// The device mesh: world = dp x pp x cp x tp ranks, tp fastest,
//   rank = ((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i
// so that tensor-parallel peers are neighbours (one node, NVLink) and data-parallel peers are
// far apart (across nodes). Each dimension has its own communicator: the ranks that differ
// only in that coordinate. Pipeline, context and tensor parallelism use pp, cp and tp. Data
// parallelism (llmc/parallel/dp.h) averages gradients over dp_cp, the dp x cp ranks that differ
// only in their data and context coordinates: context-parallel ranks hold the same weights and
// different tokens, so for the gradient they are data-parallel ranks (Megatron's combined
// data-and-context group).
//
//   world 8 = dp 2 x pp 1 x cp 1 x tp 4:   dp groups {0,4} {1,5} {2,6} {3,7}
//                                          tp groups {0,1,2,3} {4,5,6,7}
#pragma once

#include "../comm/comm.h"

typedef struct {
    int size[4];     // dp, pp, cp, tp
    int coord[4];    // this rank's coordinate in each dimension
    Comm world;
    Comm dim[4];     // dim[MESH_DP] holds the ranks that share pp, cp and tp coordinates
    Comm dp_cp;      // the ranks that share pp and tp: the dp x cp ranks that hold the same weights
                     // and different tokens, over which gradients are averaged (cp = 1: dim[MESH_DP])
} Mesh;

enum { MESH_DP = 0, MESH_PP = 1, MESH_CP = 2, MESH_TP = 3 };
static const char* MESH_NAMES[4] = {"dp", "pp", "cp", "tp"};

static inline int mesh_rank_of(const int size[4], const int coord[4]) {
    return ((coord[0] * size[1] + coord[1]) * size[2] + coord[2]) * size[3] + coord[3];
}

// Collective over `world`. Every rank checks the product, so every rank reports a bad mesh.
static inline Mesh mesh_init(Comm* world, int dp, int pp, int cp, int tp) {
    Mesh m;
    memset(&m, 0, sizeof(m));
    int sizes[4] = {dp, pp, cp, tp};
    for (int d = 0; d < 4; d++) {
        if (sizes[d] < 1) { die("--%s must be >= 1, got %d", MESH_NAMES[d], sizes[d]); }
    }
    if (dp * pp * cp * tp != world->size) {
        die("the mesh dp %d x pp %d x cp %d x tp %d = %d ranks, but mpirun started %d", dp, pp, cp, tp,
            dp * pp * cp * tp, world->size);
    }
    memcpy(m.size, sizes, sizeof(sizes));
    int r = world->rank;
    m.coord[3] = r % tp;
    m.coord[2] = (r / tp) % cp;
    m.coord[1] = (r / (tp * cp)) % pp;
    m.coord[0] = r / (tp * cp * pp);
    m.world = *world;
    for (int d = 0; d < 4; d++) {
        // color: the rank with this coordinate set to 0 (same for every member of the group)
        int c[4];
        memcpy(c, m.coord, sizeof(c));
        c[d] = 0;
        m.dim[d] = comm_split(world, mesh_rank_of(m.size, c), m.coord[d], MESH_NAMES[d]);
    }
    int c[4] = {0, m.coord[1], 0, m.coord[3]};
    m.dp_cp = comm_split(world, mesh_rank_of(m.size, c), m.coord[0] * cp + m.coord[2], cp > 1 ? "dp x cp" : "dp");
    return m;
}

static inline void mesh_print(const Mesh* m) {
    printf("mesh         world %d = dp %d x pp %d x cp %d x tp %d (tp fastest)\n", m->world.size, m->size[0],
           m->size[1], m->size[2], m->size[3]);
}

static inline void mesh_free(Mesh* m) {
    for (int d = 0; d < 4; d++) { comm_free(&m->dim[d]); }
    comm_free(&m->dp_cp);
}
