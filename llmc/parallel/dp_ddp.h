// Bucketed DDP: full replicas, the all-reduce overlapped with the backward.
//
// Memory and traffic are naive DP's (dp_naive.h): every rank holds everything,
//   memory per rank   (a + a + K) Psi
//   traffic per step  all-reduce of the gradients: 2 (N-1)/N * a Psi_pad bytes sent (ring)
// but the gradients live in buckets (buckets.h): when the last unit of a bucket finishes its
// backward, the bucket's all-reduce is handed to the communication thread while the backward
// goes on with the earlier layers. Before the update we wait for all buckets; only what is
// still running then is exposed. Gradient accumulation: the micro-steps before the last add
// into the buckets without communicating (like DDP's no_sync()).
//
//   compute:  bwd 5  bwd 4  bwd 3  bwd 2  bwd 1  bwd 0  embed  .. wait ..  AdamW
//   comm:                   [ AR b0 ]    [ AR b1 ]            [ AR b2  ]
// (six blocks in the three buckets of buckets.h's picture; AR = all-reduce)
//
// Every rank then runs the same AdamW on the same averaged gradients (no parameters sent).
#pragma once

#include "buckets.h"

static inline void ddp_init(DataParallel* dp) {
    buckets_init(dp, 0);
    bucket_install_hooks(dp, "data parallel: DDP buckets");
}

static inline void ddp_allreduce_bucket(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "all-reduce bucket %d", b);
    bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk] { dp_allreduce_avg(dp, bk->grad, bk->padded); });
    // --trace: the hand-over itself, an instant on the compute track. Its place among the compute
    // track's "backward block" events shows the overlap in program order: the backward of the
    // earlier blocks runs after it, whenever the communication thread gets to the all-reduce.
    snprintf(name, sizeof(name), "hand over all-reduce bucket %d", b);
    trace_event(name, 0, trace_now());
}

// every rank owns everything: its norm is the whole model's, no all-reduce of it
static inline float ddp_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                               float grad_clip) {
    return dp_update_owned(dp, lr, beta1, beta2, eps, weight_decay, grad_clip);
}

static inline uint64_t ddp_formula_bytes(const DataParallel* dp, int micro) {
    (void)micro;
    if (dp->comm_auto) {   // each bucket's all-reduce: what the algorithm auto takes for its size sends
        uint64_t sent = 0;
        for (const Bucket& b : dp->buckets) { sent += allreduce_auto_volume(b.padded, COMM_FLOATX, dp->N, dp->rank).bytes; }
        return sent;
    }
    return 2 * buckets_ring_share(dp);   // all-reduce = reduce-scatter + all-gather
}
static inline void ddp_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    dp_formula_rows(dp, out, a * dp->psi, a * dp->psi_pad, dp->psi);
}

static const DPModeOps DP_MODE_DDP = {
    "bucketed DDP", "ddp", 0,   // name, --dp-mode, --zero
    0, 0, "",                   // reduce_every_micro, always_counted, comm_note
    ddp_init, buckets_zero_grad, ddp_update,
    ddp_allreduce_bucket,
    NULL, NULL,                 // full_model_begin/end: the replica is always whole
    ddp_formula_bytes, ddp_formula_memory,
    0,                    // owners_disjoint: every rank updates all of it
};
