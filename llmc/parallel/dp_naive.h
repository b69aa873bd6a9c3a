// Naive data parallelism: full replicas and one all-reduce.
//
// Every rank holds all parameters, gradients and optimizer state (Psi parameters, N ranks):
//   memory per rank   (a + a + K) Psi          a = bytes per parameter/gradient, K = optimizer bytes
//                                              (CPU fp32: a = 4, K = 8 (m, v); CUDA bf16: a = 2,
//                                              K = 12 (fp32 master, m, v))
//   traffic per step  all-reduce of the gradients: each rank sends 2 (N-1)/N * a Psi bytes (ring)
// and every rank runs the same AdamW update on the same averaged gradients, so the replicas stay
// identical without ever sending parameters.
//
// After the backward pass of the last micro-step, one all-reduce (average) of the model's whole
// flat gradient buffer, then the update of everything (dp_update_owned, as every mode). Communication waits for all
// of backward, and backward waits for nothing: the whole all-reduce is exposed. Bucketed DDP
// (dp_ddp.h) starts it during the backward instead.
#pragma once

#include "dp_mode.h"

// every rank owns everything: optimizer state for the whole flat buffer
static inline void naive_init(DataParallel* dp) {
    dp_own_flat_range(dp, 0, dp->psi);
    dp_install_hooks(dp, "data parallel: naive", GPT2Hooks{});
}

static inline void naive_zero_grad(DataParallel* dp) { gpt2_zero_grad(dp->model); }

static inline float naive_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                                 float grad_clip) {
    GPT2* m = dp->model;
    dp_run(dp, "all-reduce gradients", [dp, m] { dp_allreduce_avg(dp, m->grads_memory, dp->psi); });
    return dp_update_owned(dp, lr, beta1, beta2, eps, weight_decay, grad_clip);
}

static inline uint64_t naive_formula_bytes(const DataParallel* dp, int micro) {
    (void)micro;
    return allreduce_ring_volume(dp->psi, COMM_FLOATX, dp->N, dp->rank).bytes;
}
static inline void naive_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    dp_formula_rows(dp, out, a * dp->psi, a * dp->psi, dp->psi);
}

static const DPModeOps DP_MODE_NAIVE = {
    "naive all-reduce", "naive", 0,   // name, --dp-mode, --zero
    0, 0, "",                         // reduce_every_micro, always_counted, comm_note
    naive_init, naive_zero_grad, naive_update,
    NULL,                             // bucket_ready: no buckets
    NULL, NULL,                       // full_model_begin/end: the replica is always whole
    naive_formula_bytes, naive_formula_memory,
    0,                    // owners_disjoint: every rank updates all of it
};
