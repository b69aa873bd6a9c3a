// Asynchronous and stale synchronous parameter server (--dp-mode ps --ps-async | --staleness S).
// The synchronous server (dp_ps.h) waits, every step, for the slowest worker: the barrier.
// Here rank 0 runs the server on a THREAD of its own; every rank (rank 0's main thread too) is a
// worker that pushes its gradient and pulls parameters when it is done, without a barrier:
//
//   synchronous (S = 0)            SSP (S = 1)                       asynchronous
//   w0 [ F+B ]....[ F+B ]....      w0 [ F+B ][ F+B ]..[ F+B ]        w0 [ F+B ][ F+B ][ F+B ][ F+B ]
//   w1 [ F+B zzzzz][ F+B zzzzz]    w1 [ F+B zzzzz][ F+B zzzzz]       w1 [ F+B zzzzz][ F+B zzzzz]
//   server        ^ clock 0   ^    server        ^ clock 0  ^ 1      server   ^    ^^   ^    ^   ^
//   (zzz: the straggler; ....: waiting for the others' pushes; ^: an update of the parameters)
//
// The rules. A worker's c-th push (its clock c, from 0) carries its gradient g and the version v
// of the parameters g was computed on (version = number of updates the server has applied).
//   SSP:   the server keeps every push of a clock; when all N pushes of the oldest open clock o
//          are in, it sums them in the synchronous server's order (rank 0's first, then += from
//          ranks N-1, N-2, ..., 1, then / N: llmc/comm/ps.h's ps_push), clips and runs AdamW as
//          dp_update_owned does (same kernels, same per-tensor seeds, its own step counter t):
//          version o + 1. The worker then waits for parameters of a version >= c + 1 - S, so
//          it is never more than S clocks ahead of the slowest, and the gradient of clock c is
//          applied at version c having been computed on v >= c - S: staleness c - v <= S.
//          S = 0 waits for version c + 1: the synchronous parameter server, bit for bit.
//   async: the server applies each push as it arrives (one AdamW step with that gradient and
//          that worker's lr) and answers with the parameters it now has; staleness = the
//          server's version when it applies g - v, unbounded.
//
// Cost (t_w: worker w's compute per step, t_u: one update on the server, t_c: a push + pull):
//   synchronous  step = max_w t_w + t_c + t_u: every step waits for the slowest worker
//   SSP          a worker waits only when it is S clocks ahead of the slowest: a delay shorter
//                than S steps' slack is hidden, a persistent straggler still sets the pace
//                (N steps of every worker per clock), only the overlap of its slow step with
//                the others' next S steps is gained
//   async        worker w runs at 1 / (t_w + t_c + t_u); the server applies N updates per
//                step-time and becomes the bottleneck when N t_u approaches t_w
//
// The pieces: the messages and the transport (dp_ps_async_core.h), the server thread
// (dp_ps_async_server.h), the worker's push and pull (dp_ps_async_worker.h), the formulas and
// the summary (dp_ps_async_accounting.h); here, the mode: its setup (the server thread on rank 0),
// the shutdown and its table.
#pragma once

#include "dp_ps_async_core.h"
#include "dp_ps_async_server.h"
#include "dp_ps_async_worker.h"
#include "dp_ps_async_accounting.h"

// From dp_init (the flags): nothing without --ps-async or --staleness
static inline void ps_async_create(DataParallel* dp, int async, int staleness, int held) {
    if (!async && staleness < 0) { return; }
    PSAsync* a = new PSAsync();
    a->async = async;
    a->S = async ? 0 : staleness;
    a->held = held;   // --straggler hold:RANK (-1: none)
    dp->async = a;
}

static inline float* psa_state(DataParallel* dp, int cat, size_t n) {
    float* p = (float*)dp_alloc(dp, cat, n * sizeof(float));
    device_memset_zero(p, n * sizeof(float));
    return p;
}

// Collective over the dp group: the communicator, the buffers, and on rank 0 the server thread
static inline void ps_async_init(DataParallel* dp) {
    PSAsync* a = dp->async;
    GPT2* m = dp->model;
    size_t psi = dp->psi, xb = psi * sizeof(floatX);
    a->N = dp->N;
    MPI_Comm_dup(dp->comm->mpi, &a->mpi);
    a->clock = a->version = 0;
    a->pushed_since_barrier = 0;
    a->barriers_sent = 0;
    a->loss_clock = -1;
    a->loss = 0.0f;
    a->stage = PSA_STAGED ? (floatX*)malloc(xb) : NULL;
    a->params = a->grad = NULL;
    a->m = a->v = a->master = NULL;
    a->norm_scratch = NULL;
    a->sstage = a->pstage = NULL;
    a->pstage_version = -1;
    a->sversion = a->sstep = 0;
    a->last_norm = 0.0f;
    a->server_bytes = 0;
    a->answers_remote = 0;
    a->barriers = 0;
    if (dp->rank == 0) {
        // the server's parameters start as rank 0's (every rank initialised the same model)
        a->params = (floatX*)dp_alloc(dp, MEM_PARAMS, xb);
        copy_device_to_device(a->params, m->params_memory, xb);
        a->grad = (floatX*)dp_alloc(dp, MEM_GRADS, xb);
        a->m = psa_state(dp, MEM_OPTIM, psi);
        a->v = psa_state(dp, MEM_OPTIM, psi);
        if (dp_has_master(dp)) {
            a->master = psa_state(dp, MEM_MASTER, psi);
            convert_floatX_to_float(a->master, a->params, psi);
        }
        a->norm_scratch = (float*)device_malloc(sizeof(float));
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            const ParamInfo* p = &m->param_info[i];
            if (p->numel == 0 || p->offset >= psi) { continue; }
            size_t s = p->offset, n = std::min(p->numel, psi - s);
            a->segments.push_back({{i, a->params + s, a->grad + s, a->m + s, a->v + s, a->master ? a->master + s : NULL, n, s},
                                   dp_segment_counted(m, i), p->decay});
        }
        int nslots = a->async ? 0 : (a->S + 1) * a->N;
        for (int k = 0; k < nslots; k++) { a->slots.push_back((floatX*)dp_alloc(dp, MEM_GRADS, xb)); }
        a->slot_msg.assign(nslots, PSAMessage{});
        a->slot_clock.assign(nslots, -1);
        if (PSA_STAGED) { a->sstage = (floatX*)malloc(xb); a->pstage = (floatX*)malloc(xb); }
        a->losses.assign(a->N, std::vector<float>());
        a->pushes.assign(a->N, 0);
        a->first_push.assign(a->N, 0.0);
        a->last_push.assign(a->N, 0.0);
        a->bound_waits.assign(a->N, 0);
        a->max_ahead = 0;
    }
    MPI_Barrier(a->mpi);   // every worker has its communicator before the first request
    a->t0 = wall_seconds();
    if (dp->rank == 0) { a->thread = std::thread(psa_server_main, dp); }
    dp_install_hooks(dp, a->async ? "data parallel: asynchronous parameter server" : "data parallel: stale synchronous parameter server",
                     GPT2Hooks{});
}

static inline void ps_async_zero_grad(DataParallel* dp) { gpt2_zero_grad(dp->model); }
static inline void ps_async_full_model_begin(DataParallel* dp) { psa_barrier(dp); }

// plan_mean's loss of the step just done (the worker's own): it goes with the next request
static inline float ps_async_note_loss(DataParallel* dp, float loss) {
    dp->async->loss_clock = dp->async->clock - 1;
    dp->async->loss = loss;
    return loss;
}

// dp_shutdown: every worker says goodbye (with its last loss), the server thread ends once all
// have, the buffers go. (After gpt2_free: nothing here reads the model.)
static inline void ps_async_free(DataParallel* dp) {
    PSAsync* a = dp->async;
    if (!a) { return; }
    psa_request(dp, PSA_DONE, -1, 0, 0, 0, 0, 0, 0, 1.0f);
    if (dp->rank == 0) {
        a->thread.join();
        dp_free(dp, MEM_PARAMS, a->params, dp->psi * sizeof(floatX));
        dp_free(dp, MEM_GRADS, a->grad, dp->psi * sizeof(floatX));
        for (floatX* s : a->slots) { dp_free(dp, MEM_GRADS, s, dp->psi * sizeof(floatX)); }
        dp_free(dp, MEM_OPTIM, a->m, dp->psi * sizeof(float));
        dp_free(dp, MEM_OPTIM, a->v, dp->psi * sizeof(float));
        dp_free(dp, MEM_MASTER, a->master, dp->psi * sizeof(float));
        device_free(a->norm_scratch);
        free(a->sstage);
        free(a->pstage);
    }
    free(a->stage);
    MPI_Comm_free(&a->mpi);
    delete a;
    dp->async = NULL;
}

static const DPModeOps DP_MODE_PS_ASYNC = {
    "asynchronous / stale synchronous parameter server", "ps", 0,    // name, --dp-mode, --zero
    0, 1, "; parameter server push/pull without a barrier, server on a thread of rank 0 (ours: counted)",
    ps_async_init, ps_async_zero_grad, psa_update,
    NULL,                                          // bucket_ready: no buckets
    ps_async_full_model_begin, NULL,               // the barrier before evaluation, samples, saves
    ps_async_formula_bytes, ps_async_formula_memory,
    0,                    // owners_disjoint: the workers own nothing (the server's state is its own)
};
