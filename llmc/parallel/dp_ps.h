// Synchronous parameter server (Li et al., 2014), the lecture's first data-parallel design.
// Every rank is a worker; ranks 0 .. S-1 of the data-parallel group are also servers. The flat
// parameter vector (Psi elements) is split into S slices (the balanced split of comm.h);
// server s owns slice s: it alone keeps that slice's optimizer state and updates it.
//
//   1. workers compute gradients (the full flat gradient buffer, as in naive DP)
//   2. push:   each worker sends slice s of its gradients to server s; the server sums them
//   3. update: each server averages its slice and runs AdamW on it (the gradient norm for
//              clipping: the servers' squared norms are summed, one small all-reduce)
//   4. pull:   each server sends its updated parameter slice to every worker
//
// Traffic per step (a bytes per element):
//   server: receives (N-1) a Psi/S (push) and sends (N-1) a Psi/S (pull)
//   worker: sends a Psi minus its own slice (push) and receives as much (pull)
// With S = 1 the server's link carries 2 (N-1) a Psi while a worker's carries 2 a Psi: the
// server is the bottleneck, and it grows with N. The counters in the summary show it.
// Memory: servers hold K Psi/S optimizer bytes, the other ranks none.
//
// The push and pull are llmc/comm/ps.h's ps_push / ps_pull (its all-reduce is push + pull):
// p-1 rounds, at round k rank r sends to r+k and receives from r-k, so no two ranks ever wait
// on each other in a cycle. ps_update calls them and runs the servers' update in between; the
// bytes a rank sends are allreduce_parameter_server_volume's (push + pull of the same buffer).
#pragma once

#include "../comm/ps.h"
#include "dp_mode.h"
#include "dp_compress.h"   // compress_ps_push

// A server's optimizer state covers its slice of the flat buffers; its segments are that slice
// cut at tensor boundaries. Workers own nothing.
static inline void ps_init(DataParallel* dp) {
    int S = dp->ps_servers;
    if (dp->rank < S) { dp_own_flat_range(dp, comm_block_offset(dp->psi, S, dp->rank), comm_block_count(dp->psi, S, dp->rank)); }
    dp_install_hooks(dp, "data parallel: parameter server", GPT2Hooks{});
}

static inline void ps_zero_grad(DataParallel* dp) { gpt2_zero_grad(dp->model); }

static inline float ps_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_clip) {
    GPT2* m = dp->model;
    int S = dp->ps_servers;
    dp_run(dp, "push gradients", [dp, m, S] {
        if (dp->compress) { compress_ps_push(dp); }   // --compress: compressed slices (dp_compress.h)
        else { ps_push(dp->comm, m->grads_memory, dp->psi, COMM_FLOATX, COMM_AVG, S); }
    });
    float norm = dp_update_owned(dp, lr, beta1, beta2, eps, weight_decay, grad_clip);   // servers only
    dp_run(dp, "pull parameters", [dp, m, S] { ps_pull(dp->comm, m->params_memory, dp->psi, COMM_FLOATX, S); });
    return norm;
}

static inline uint64_t ps_formula_bytes(const DataParallel* dp, int micro) {
    (void)micro;
    return allreduce_parameter_server_volume(dp->psi, COMM_FLOATX, dp->N, dp->rank, dp->ps_servers).bytes;
}
static inline void ps_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    size_t owned = dp->rank < dp->ps_servers ? comm_block_count(dp->psi, dp->ps_servers, dp->rank) : 0;
    dp_formula_rows(dp, out, a * dp->psi, a * dp->psi, owned);
}

static const DPModeOps DP_MODE_PS = {
    "parameter server", "ps", 0,                          // name, --dp-mode, --zero
    0, 1, "; parameter server push/pull (ours: counted)",  // reduce_every_micro, always_counted, comm_note
    ps_init, ps_zero_grad, ps_update,
    NULL,                                                 // bucket_ready: no buckets
    NULL, NULL,                                           // full_model_begin/end: every worker has it all
    ps_formula_bytes, ps_formula_memory,
    1,                    // owners_disjoint
};
