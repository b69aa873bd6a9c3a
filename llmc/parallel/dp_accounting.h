// What the lecture's formulas predict for data parallelism, printed beside what was measured
// (dp.h's memory table, and the comm line under each step): the rows of the memory table every
// mode fills, the bytes of a ring pass over the buckets, and the bytes and memory of ZeRO-1, 2
// and 3 (their table: dp_zero.h). N ranks, Psi parameters (Psi_pad after padding each bucket
// to a multiple of N), a bytes per value, m micro-steps per step; per rank and step:
//
//             parameters  gradients    optimizer (K per owned value)   bytes sent
//   ZeRO-1    a Psi       a Psi_pad    K Psi_pad / N                  2 (N-1)/N a Psi_pad
//   ZeRO-2    a Psi       a Psi_pad/N  K Psi_pad / N                  (m + 1) (N-1)/N a Psi_pad
//   ZeRO-3    a Psi_pad/N a Psi_pad/N  K Psi_pad / N                  m (2 (Psi_pad - root) + root
//                                                                       + Psi_pad) (N-1)/N a
// (a pipeline stage's deferred root is reduce-scattered once per step, not m times)
#pragma once

#include <algorithm>
#include <string.h>
#include "dp_core.h"

// The memory formula's rows: parameters and gradients as the mode says, the optimizer state
// (K bytes per owned parameter: m, v and the master weights where there are any) on the device
// unless offloaded, the activations as the model allocated them.
static inline void dp_formula_rows(const DataParallel* dp, size_t out[MEM_NCAT], size_t params, size_t grads,
                                   size_t owned) {
    memset(out, 0, MEM_NCAT * sizeof(size_t));
    size_t on_device = dp->offload ? 0 : 1;
    out[MEM_PARAMS] = params;
    out[MEM_GRADS] = grads;
    out[MEM_MASTER] = dp_has_master(dp) ? on_device * 4 * owned : 0;
    out[MEM_OPTIM] = on_device * 8 * owned;
    out[MEM_ACTS] = dp->model->acts_bytes;
}

// bytes one reduce-scatter (or all-gather) of every bucket sends from this rank with the ring:
// (N-1)/N of the padded total
static inline uint64_t buckets_ring_share(const DataParallel* dp) {
    return (uint64_t)(dp->N - 1) * (dp->psi_pad / dp->N) * sizeof(floatX);
}

// layernorm gradient elements of the owned ranges: what sequence parallelism completes over the
// tp group before an update (the sum of plan_norm_elems' segments, from the layout alone)
static inline size_t buckets_norm_elems(const DataParallel* dp, int stage) {
    size_t total = 0;
    for (const Bucket& b : dp->buckets) {
        size_t lo, n, hi;
        bucket_owned(dp, &b, stage, &lo, &n, &hi);
        for (const Slice& s : b.slices) {
            size_t x = std::max(lo, s.packed), e = std::min(hi, s.packed + s.count);
            if (x < e && dp->model->param_info[s.tensor].norm) { total += e - x; }
        }
    }
    return total;
}

// --- ZeRO-1 and ZeRO-2 (dp_zero.h)

static inline uint64_t zero1_formula_bytes(const DataParallel* dp, int micro) {
    (void)micro;
    return 2 * buckets_ring_share(dp);   // RS + AG, once per step
}
static inline uint64_t zero2_formula_bytes(const DataParallel* dp, int micro) {
    // RS per micro-step, one AG; a pipeline's root bucket (a bucket of its own: the tied wte waits
    // for the embedding group's sum, dp_root_done) is reduce-scattered once, after the last micro-batch
    uint64_t once = 0;
    if (dp->root_deferred && dp->root_unit >= 0) {
        once = (uint64_t)(dp->N - 1) * (dp->buckets[dp->unit_bucket[dp->root_unit]].padded / dp->N) * sizeof(floatX);
    }
    return (uint64_t)micro * (buckets_ring_share(dp) - once) + once + buckets_ring_share(dp);
}
static inline void zero1_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    dp_formula_rows(dp, out, a * dp->psi, a * dp->psi_pad, dp->psi_pad / dp->N);
}
static inline void zero2_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    dp_formula_rows(dp, out, a * dp->psi, a * dp->psi_pad / dp->N, dp->psi_pad / dp->N);
}

// --- ZeRO-3 (dp_zero3.h)

// the root's padded bucket (0 when this rank holds no tensor outside the blocks)
static inline size_t zero3_root_padded(const DataParallel* dp) {
    return dp->root_unit >= 0 ? dp->buckets[dp->unit_bucket[dp->root_unit]].padded : 0;
}
// per micro-step: all-gather of every block twice (forward, backward) and of the root once,
// reduce-scatter of everything
static inline uint64_t zero3_formula_bytes(const DataParallel* dp, int micro) {
    int N = dp->N;
    size_t a = sizeof(floatX);
    size_t root = zero3_root_padded(dp);
    uint64_t blocks = (uint64_t)(N - 1) * ((dp->psi_pad - root) / N) * a;
    uint64_t rootb = (uint64_t)(N - 1) * (root / N) * a;
    return (uint64_t)micro * (2 * blocks + rootb + buckets_ring_share(dp));
}
static inline void zero3_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    dp_formula_rows(dp, out, a * dp->psi_pad / dp->N, a * dp->psi_pad / dp->N, dp->psi_pad / dp->N);
}
