// 2D-torus all-reduce on an R x C grid of ranks (R C = p): rank r sits at row r / C, column
// r mod C; every row and every column is a ring (the torus's wrap-around links).
//
//   R = 2, C = 3:     r0 r1 r2        1. reduce-scatter along each row (ring over C ranks):
//                     r3 r4 r5           rank (i, j) owns block j of its row's sum
//                                     2. all-reduce along each column (ring over R ranks) on
//                                        that block: block j now holds all p ranks' sum
//                                     3. all-gather along each row (ring): everyone has all
//
// Cost (S bytes):  2 (C-1) alpha + 2 (C-1)/C S beta          (rows, steps 1 and 3)
//                + 2 alpha + 2 (R-1)/R (S/C) beta      (columns, step 2)
// versus the flat ring's 2 (p-1) alpha: 2 (R + C - 2) messages, e.g. 12 instead of 30 for
// 4 x 4, at about the same bytes; both directions of both dimensions can run at once on a real
// torus (not done here).
//
// A row is what hierarchical.h calls a node (C consecutive ranks) and step 2 its inter-node
// ring, so the schedule is allreduce_hierarchical_plan's with node size C; what this file adds is
// the grid and its check.
#pragma once

#include "hierarchical.h"

static inline void torus2d_check_grid(Comm* c, const char* call, int rows, int cols) {
    comm_check_agree(c, call, "grid rows", rows);
    comm_check_agree(c, call, "grid columns", cols);
    if (rows < 1 || cols < 1 || (long long)rows * cols != c->size) {
        comm_die(c, call, "a %d x %d grid needs %lld ranks, the communicator has %d", rows, cols,
                 (long long)rows * cols, c->size);
    }
}

static inline void allreduce_torus2d(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op,
                                     int rows, int cols) {
    comm_check_args(c, "allreduce_torus2d", count, t, op, 0);
    torus2d_check_grid(c, "allreduce_torus2d", rows, cols);
    HierPlan h = hier_plan_make(c, "allreduce_torus2d", cols);   // "node" = a row, "cross" = a column
    int saved = c->check_args;
    c->check_args = 0;   // checked above
    allreduce_hierarchical_plan(c, &h, send, recv, count, t, op, HIER_INTER_RING);
    c->check_args = saved;
    hier_plan_free(&h);
}

static inline CommVolume allreduce_torus2d_volume(size_t count, CommType t, int p, int r, int rows, int cols) {
    (void)rows;
    return allreduce_hierarchical_volume(count, t, p, r, cols, HIER_INTER_RING);
}
