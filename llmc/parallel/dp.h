// Data parallelism: the trainer's entry points. One optimizer step on N ranks:
//   dp_zero_grad                  start of the step
//   for each micro-step:
//     dp_micro_step(micro, n)     tells the hooks whether this backward communicates
//     gpt2_forward / gpt2_classifier / gpt2_backward   (the hooks of each mode run inside)
//   dp_update                     wait for the gradients, clip, AdamW on what this rank owns,
//                                 bring the parameters back in sync
// The modes, each in its own file with its memory and traffic formulas:
//   naive, bucketed DDP  ddp.h       parameter server  ps.h
//   ZeRO-1, 2, 3         zero.h      ZeRO-Offload      offload.h
// Each rank's gradient is the mean over its own B/N sequences (dloss = 1 / (its tokens)); the
// collectives average over ranks, so the update sees the mean over the global batch, exactly
// as on one rank.
#pragma once

#include <algorithm>
#include "dp_core.h"
#include "ddp.h"
#include "zero.h"
#include "ps.h"
#include "offload.h"

static inline int dp_is_bucketed(const DataParallel* dp) { return dp->mode != DP_NAIVE && dp->mode != DP_PS; }
static inline int dp_is_zero(const DataParallel* dp) { return dp->mode >= DP_ZERO1; }
static inline int dp_has_master(const DataParallel* dp) { return BACKEND_MASTER_WEIGHTS || dp->offload; }

// optimizer state for n parameters: on the device, or on the host with --offload
static inline float* dp_state(DataParallel* dp, int cat, size_t n) {
    if (dp->offload) { dp->host_live += n * sizeof(float); return host_floats(n); }
    float* p = (float*)dp_alloc(dp, cat, n * sizeof(float));
    device_memset_zero(p, n * sizeof(float));
    return p;
}

// fp32 master weights of a range of floatX parameters (device or host)
static inline void dp_seed_master(DataParallel* dp, float* master, const floatX* params, size_t n) {
    if (dp->offload) { copy_floats_to_host(master, params, n); }
    else { convert_floatX_to_float(master, params, n); }
}

static inline void dp_init(DataParallel* dp, GPT2* model, Comm* comm, DPMode mode, int offload, int use_ring,
                           int ps_servers, double bucket_mb) {
    memset(dp->mem_live, 0, sizeof(dp->mem_live));
    memset(dp->mem_peak, 0, sizeof(dp->mem_peak));
    dp->host_live = 0;
    dp->offload_scratch = NULL;
    dp->own_flat_offset = dp->own_flat_count = 0;
    dp->flat_m = dp->flat_v = dp->flat_master = NULL;
    dp->sync = 1;
    dp->materialized = 0;
    dp->enqueued = dp->completed = 0;
    dp->stop = 0;
    dp->comm_seconds = dp->exposed_seconds = 0.0;
    dp->step_bytes_start = 0;
    dp->mode = mode;
    dp->offload = offload;
    dp->use_ring = use_ring;
    dp->ps_servers = ps_servers;
    dp->bucket_bytes = (size_t)(bucket_mb * 1048576.0);
    dp->comm = comm;
    dp->N = comm->size;
    dp->rank = comm->rank;
    dp->model = model;
    dp->psi = model->num_parameters;
    dp->psi_pad = model->num_parameters;
    dp->thread = std::thread(dp_thread_main, dp);
    size_t a = sizeof(floatX), psi = dp->psi;
    // the model's own buffers count too
    dp->mem_live[MEM_PARAMS] = psi * a;
    dp->mem_live[MEM_GRADS] = psi * a;
    dp->mem_live[MEM_ACTS] = model->acts_bytes;

    if (mode == DP_NAIVE) {
        gpt2_allocate_optimizer(model);
        dp->mem_live[MEM_OPTIM] = 2 * psi * sizeof(float);
        if (model->master_memory) { dp->mem_live[MEM_MASTER] = psi * sizeof(float); }
    } else if (mode == DP_PS) {
        int S = ps_servers;
        if (dp->rank < S) {
            dp->own_flat_offset = comm_block_offset(psi, S, dp->rank);
            dp->own_flat_count = comm_block_count(psi, S, dp->rank);
            size_t n = dp->own_flat_count, o = dp->own_flat_offset;
            dp->flat_m = dp_state(dp, MEM_OPTIM, n);
            dp->flat_v = dp_state(dp, MEM_OPTIM, n);
            if (dp_has_master(dp)) {
                dp->flat_master = dp_state(dp, MEM_MASTER, n);
                dp_seed_master(dp, dp->flat_master, model->params_memory + o, n);
            }
            // segments: the server's block cut at tensor boundaries
            for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
                const ParamInfo* p = &model->param_info[i];
                size_t s = std::max(o, p->offset), e = std::min(o + n, p->offset + p->numel);
                if (s >= e) { continue; }
                dp->segments.push_back({i, model->params_memory + s, model->grads_memory + s, dp->flat_m + (s - o),
                                         dp->flat_v + (s - o), dp->flat_master ? dp->flat_master + (s - o) : NULL, e - s});
            }
        }
    } else {
        dp_build_layout(dp, mode == DP_ZERO3);
        for (Bucket& b : dp->buckets) {
            // what this rank owns: everything (DDP) or its block (ZeRO)
            size_t lo = dp_is_zero(dp) ? (size_t)dp->rank * b.shard : 0;
            size_t n = dp_is_zero(dp) ? b.shard : b.count;
            size_t hi = std::min(lo + n, b.count);
            if (mode == DP_DDP || mode == DP_ZERO1) {
                b.grad = (floatX*)dp_alloc(dp, MEM_GRADS, b.padded * a);
                device_memset_zero(b.grad, b.padded * a);
            } else {
                b.grad_shard = (floatX*)dp_alloc(dp, MEM_GRADS, b.shard * a);
                device_memset_zero(b.grad_shard, b.shard * a);
            }
            // a packed copy of the parameters of the owned range, to seed shards and masters
            floatX* packed = dp_take(dp, MEM_COMM, b.padded, 1);
            dp_copy_range(&b, model->params_memory, packed, lo, hi, 1);
            if (mode == DP_ZERO3) {
                b.param_shard = (floatX*)dp_alloc(dp, MEM_PARAMS, b.shard * a);
                copy_device_to_device(b.param_shard, packed + lo, b.shard * a);
            }
            b.m = dp_state(dp, MEM_OPTIM, n);
            b.v = dp_state(dp, MEM_OPTIM, n);
            if (dp_has_master(dp)) {
                b.master = dp_state(dp, MEM_MASTER, n);
                dp_seed_master(dp, b.master, packed + lo, n);
            }
            dp_give(dp, MEM_COMM, packed, b.padded);
            for (const Slice& s : b.slices) {
                size_t x = std::max(lo, s.packed), e = std::min(hi, s.packed + s.count);
                if (x >= e) { continue; }
                OptSegment seg;
                seg.tensor = s.tensor;
                seg.n = e - x;
                seg.param = mode == DP_ZERO3 ? b.param_shard + (x - lo) : model->params_memory + s.flat + (x - s.packed);
                seg.grad = mode == DP_DDP || mode == DP_ZERO1 ? b.grad + x : b.grad_shard + (x - lo);
                seg.m = b.m + (x - lo);
                seg.v = b.v + (x - lo);
                seg.master = b.master ? b.master + (x - lo) : NULL;
                dp->segments.push_back(seg);
            }
        }
        // the model's flat gradient buffer is replaced by the buckets; ZeRO-3 also drops the
        // full parameters (only the shards remain)
        device_free(model->grads_memory);
        model->grads_memory = NULL;
        point_parameters(&model->grads, NULL, model->param_info);
        dp->mem_live[MEM_GRADS] -= psi * a;
        if (mode == DP_ZERO3) {
            device_free(model->params_memory);
            model->params_memory = NULL;
            point_parameters(&model->params, NULL, model->param_info);
            dp->mem_live[MEM_PARAMS] -= psi * a;
            zero3_install_hooks(dp);
        } else {
            bucket_install_hooks(dp);
        }
    }
    if (dp->offload) {
        size_t most = 0;
        for (const OptSegment& s : dp->segments) { most = std::max(most, s.n); }
        dp->offload_scratch = host_floats(most);
    }
    for (int c = 0; c < MEM_NCAT; c++) { dp->mem_peak[c] = dp->mem_live[c]; }
}

static inline void dp_zero_grad(DataParallel* dp) {
    if (dp->mode == DP_NAIVE || dp->mode == DP_PS) { gpt2_zero_grad(dp->model); }
    for (Bucket& b : dp->buckets) {
        if (b.grad && (dp->mode == DP_DDP || dp->mode == DP_ZERO1)) { device_memset_zero(b.grad, b.padded * sizeof(floatX)); }
        if (b.grad_shard) { device_memset_zero(b.grad_shard, b.shard * sizeof(floatX)); }
    }
    dp->comm_seconds = 0.0;
    dp->exposed_seconds = 0.0;
    dp->step_bytes_start = dp->comm->bytes_sent;
}

// Only the last micro-step's backward communicates, except in ZeRO-2/3, which have no full
// gradient buffer to accumulate in and reduce-scatter every micro-step.
static inline void dp_micro_step(DataParallel* dp, int micro, int nmicro) {
    dp->sync = micro == nmicro - 1 || dp->mode == DP_ZERO2 || dp->mode == DP_ZERO3;
}

// squared norm of what this rank owns, summed over the ranks that own disjoint parts
static inline float dp_grad_norm(DataParallel* dp) {
    GPT2* m = dp->model;
    double sq = 0.0;
    for (const OptSegment& s : dp->segments) {
        float part;
        global_norm_squared(m->norm_squared, s.grad, s.n);
        copy_device_to_host(&part, m->norm_squared, sizeof(float));
        sq += part;
    }
    if (dp->mode != DP_DDP) {   // ZeRO and PS: the owners are disjoint; 8 bytes, not counted
        MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, dp->comm->mpi);
    }
    return (float)sqrt(sq);
}

// After the last micro-step's backward. Returns the gradient norm before clipping.
static inline float dp_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                              float grad_clip) {
    GPT2* m = dp->model;
    if (dp->mode == DP_NAIVE) {
        naive_allreduce_gradients(dp);
        return gpt2_update(m, lr, beta1, beta2, eps, weight_decay, grad_clip);
    }
    if (dp->mode == DP_PS) {
        int S = dp->ps_servers;
        dp_run(dp, "push gradients", [dp, m, S] { ps_push(dp->comm, m->grads_memory, m->num_parameters, COMM_FLOATX, COMM_AVG, S); });
    }
    dp_wait_all(dp);   // every bucket's collective has finished
    dp->in_flight.clear();
    double t0 = trace_now();
    float norm = dp_grad_norm(dp);
    float grad_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
    m->step += 1;
    for (const OptSegment& s : dp->segments) {
        float wd = m->param_info[s.tensor].decay ? weight_decay : 0.0f;
        if (dp->offload) {
            offload_adamw(s.param, s.master, s.grad, s.m, s.v, s.n, dp->offload_scratch, lr, beta1, beta2, eps, wd,
                          m->step, grad_scale);
        } else {
            adamw_update(s.param, s.master, s.grad, s.m, s.v, s.n, lr, beta1, beta2, eps, wd, m->step, grad_scale,
                         (unsigned int)(m->step * 1000003u + s.tensor));
        }
    }
    trace_event("AdamW update", 0, t0);
    if (dp->mode == DP_PS) {
        int S = dp->ps_servers;
        dp_run(dp, "pull parameters", [dp, m, S] { ps_pull(dp->comm, m->params_memory, m->num_parameters, COMM_FLOATX, S); });
    } else if (dp->mode == DP_ZERO1 || dp->mode == DP_ZERO2) {
        zero_allgather_parameters(dp);
    }
    return norm;
}

// ---------------------------------------------------------------------------------------
// What the lecture predicts, to print next to what was measured.

// bytes this rank sends in one optimizer step of `micro` micro-steps, with our ring collectives
static inline uint64_t dp_formula_bytes(const DataParallel* dp, int micro) {
    int N = dp->N;
    size_t a = sizeof(floatX);
    if (N == 1) { return 0; }
    if (dp->mode == DP_NAIVE) { return allreduce_ring_volume(dp->psi, COMM_FLOATX, N, dp->rank).bytes; }
    if (dp->mode == DP_PS) { return allreduce_parameter_server_volume(dp->psi, COMM_FLOATX, N, dp->rank, dp->ps_servers).bytes; }
    // a padded bucket of n elements: RS or AG sends (N-1) n/N elements, all-reduce twice that
    uint64_t share = (uint64_t)(N - 1) * (dp->psi_pad / N) * a;
    if (dp->mode == DP_DDP || dp->mode == DP_ZERO1) { return 2 * share; }
    if (dp->mode == DP_ZERO2) { return (uint64_t)micro * share + share; }
    // ZeRO-3, per micro-step: all-gather of every block twice (forward, backward) and of the
    // root once, reduce-scatter of everything
    int L = dp->model->config.num_layers;
    size_t root = dp->buckets[dp->unit_bucket[L]].padded;
    uint64_t blocks = (uint64_t)(N - 1) * ((dp->psi_pad - root) / N) * a;
    uint64_t rootb = (uint64_t)(N - 1) * (root / N) * a;
    return (uint64_t)micro * (2 * blocks + rootb + share);
}

// bytes per category that the lecture's table gives for this rank
static inline void dp_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX), psi = dp->psi, pad = dp->psi_pad, N = dp->N;
    size_t owned = psi;   // parameters whose optimizer state this rank keeps
    if (dp_is_zero(dp)) { owned = pad / N; }
    if (dp->mode == DP_PS) { owned = dp->rank < dp->ps_servers ? comm_block_count(psi, dp->ps_servers, dp->rank) : 0; }
    memset(out, 0, MEM_NCAT * sizeof(size_t));
    out[MEM_PARAMS] = dp->mode == DP_ZERO3 ? a * pad / N : a * psi;
    out[MEM_GRADS] = dp->mode == DP_NAIVE || dp->mode == DP_PS ? a * psi
                   : dp->mode == DP_DDP || dp->mode == DP_ZERO1 ? a * pad : a * pad / N;
    size_t on_device = dp->offload ? 0 : 1;
    out[MEM_MASTER] = dp_has_master(dp) ? on_device * 4 * owned : 0;
    out[MEM_OPTIM] = on_device * 8 * owned;
    out[MEM_ACTS] = dp->model->acts_bytes;
}

static inline const char* mib(size_t bytes, char* buf) {
    snprintf(buf, 32, "%9.3f MiB", bytes / 1048576.0);
    return buf;
}

// The memory table: measured (from the DP layer's allocator accounting) against the formula.
// Every rank checks its own row; rank 0 prints. Returns 1 when all ranks match.
static inline int dp_print_memory(DataParallel* dp) {
    size_t f[MEM_NCAT];
    dp_formula_memory(dp, f);
    int ok = 1;
    for (int c = 0; c <= MEM_ACTS; c++) { if (dp->mem_live[c] != f[c]) { ok = 0; } }
    int all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, dp->comm->mpi);
    char b1[32], b2[32];
    const char* K = BACKEND_MASTER_WEIGHTS || dp->offload ? "12 (master, m, v)" : "8 (m, v)";
    printf("data parallel %s on %d ranks: Psi = %zu parameters (%zu padded), a = %zu bytes, K = %s\n",
           DP_MODE_NAMES[dp->mode], dp->N, dp->psi, dp->psi_pad, sizeof(floatX), K);
    if (dp_is_bucketed(dp)) {
        printf("buckets      %zu (", dp->buckets.size());
        for (size_t b = 0; b < dp->buckets.size(); b++) {
            printf("%s%.2f MiB", b ? ", " : "", dp->buckets[b].padded * sizeof(floatX) / 1048576.0);
        }
        printf(")%s\n", dp->mode == DP_ZERO3 ? " one per block + root" : "");
    }
    printf("memory per rank (rank %d)   measured        formula\n", dp->rank);
    for (int c = 0; c < MEM_NCAT - 1; c++) {
        printf("  %-18s %s  %s\n", MEM_NAMES[c], mib(dp->mem_live[c], b1), mib(f[c], b2));
    }
    if (dp->offload) { printf("  %-18s %s  (host memory: master, m, v)\n", "offloaded", mib(dp->host_live, b1)); }
    printf("memory check %s (measured %s formula on all %d ranks)\n", all_ok ? "ok" : "FAILED", all_ok ? "=" : "!=", dp->N);
    return all_ok;
}

// After a step: the transient buffers' peak (ZeRO-2 buckets in flight, ZeRO-3 gathered blocks)
static inline void dp_print_peaks(const DataParallel* dp) {
    char b1[32], b2[32];
    printf("in flight    gradient buffers peak %s | gathered/comm buffers peak %s\n",
           mib(dp->mem_peak[MEM_GRADS], b1), mib(dp->mem_peak[MEM_COMM], b2));
}

// Communication of the step that just ended: counted bytes against the formula, time.
static inline uint64_t dp_step_bytes(const DataParallel* dp) { return dp->comm->bytes_sent - dp->step_bytes_start; }

// ZeRO-3 keeps no full parameters: evaluation and checkpoints gather them first
static inline void dp_full_model_begin(DataParallel* dp) { if (dp->mode == DP_ZERO3) { zero3_materialize(dp); } }
static inline void dp_full_model_end(DataParallel* dp) { if (dp->mode == DP_ZERO3) { zero3_dematerialize(dp); } }

static inline void dp_shutdown(DataParallel* dp) {
    {
        std::lock_guard<std::mutex> lock(dp->mu);
        dp->stop = 1;
    }
    dp->cv.notify_all();
    dp->thread.join();
    // what dp_init allocated (the model's own buffers are gpt2_free's)
    auto release = [dp](float* p) { if (dp->offload) { free(p); } else { device_free(p); } };
    for (Bucket& b : dp->buckets) {
        device_free(b.grad);
        device_free(b.grad_shard);
        device_free(b.param_shard);
        release(b.m);
        release(b.v);
        if (b.master) { release(b.master); }
    }
    if (dp->flat_m) { release(dp->flat_m); release(dp->flat_v); }
    if (dp->flat_master) { release(dp->flat_master); }
    for (auto& entry : dp->pool) { device_free(entry.second); }
    free(dp->offload_scratch);
    dp->buckets.clear();
    dp->pool.clear();
    dp->segments.clear();
}
