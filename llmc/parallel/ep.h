// Expert parallelism: the E experts of every MoE block (llmc/model/moe.h) split over ep ranks, and each
// token travels to the rank that holds its expert and back (GShard; DeepSpeed-MoE; Megatron).
// The lecture "LLM Pre-training and Beyond", slide "Expert Parallelism applied on
// Mixture-of-Experts".
//
// The ep group is formed from the data-parallel ranks, as DeepSpeed and Megatron do: dp ranks
// [g ep, (g+1) ep) form ep group g, and rank j of every group holds experts [j E/ep, (j+1) E/ep).
// Every rank still routes its own tokens; dense weights stay replicated over dp.
//
//   dp 4, ep 2, E = 4:   ep groups {0,1} {2,3}: rank 0 and 2 hold experts 0,1; ranks 1 and 3 hold 2,3
//                        expert-data-parallel (edp) groups {0,2} {1,3}: the replicas of the same experts
//
// One MoE block on one rank, forward (the backward runs the same exchanges in the same order,
// carrying gradients):
//   1. route its B T tokens (host): which expert, kept or dropped, the rows per (rank, expert)
//   2. exchange the counts: every rank learns how many rows it will receive per (source, expert)
//   3. dispatch: all-to-all-v of the kept pairs' token rows, to the experts' ranks
//   4. run its E/ep experts on what arrived (rows of all ep ranks' tokens, expert by expert)
//   5. combine, part 1: all-to-all-v of the expert outputs back to the tokens' ranks
//   6. combine, part 2: out[t] = sum_j g_tj y_tj on the token's own rank
//
// Bytes per MoE block and micro-batch that a rank sends (a = bytes per element, C channels):
//   2 a C (rows it dispatches to other ranks + rows other ranks dispatched to it)
// (four exchanges: in the forward its own rows out and the others' rows back, in the backward
// the same two with gradients). With balanced routing and no drops a rank dispatches
// k B T (ep-1)/ep of its rows away and receives as many: 4 a C k B T (ep-1)/ep. The trainer
// prints the exact figure from the measured routing beside the bytes counted, and the balanced
// estimate.
//
// Gradients. A dense weight's gradient is averaged over dp as before. An expert's weights live on
// dp/ep ranks (its edp group), and its gradient on each of them already sums over the tokens of a
// whole ep group: the mean over the global batch is the average over edp divided by ep. Averaging
// over all dp ranks instead would mix different experts' gradients (doc/expert-parallel.md shows
// the equivalence test failing). Data parallelism (llmc/parallel/dp.h) leaves the expert tensors
// out of its buckets (skip_experts); ep keeps their gradients, reduces them over edp before the
// update and hands their segments to dp's update (ExpertOwners), so one clip covers the model.
#pragma once

#include <vector>
#include "../model/gpt2.h"
#include "../comm/comm.h"
#include "../comm/native.h"
#include "../comm/alltoall.h"
#include "../comm/ring.h"
#include "dp.h"

typedef struct {
    GPT2* model;
    Comm comm;              // the ep group
    Comm edp;               // the ranks that hold the same experts
    Comm* dp_comm;          // the data-parallel group the two are formed from
    int ep, rank, dp;
    int use_ring;           // ours (pairwise all-to-all-v, ring all-reduce: bytes counted) or native
    MoEExchange xch;
    // the expert tensors' gradients, and their optimizer state
    size_t offset, count;   // the expert tensors' range of the flat buffer
    floatX* grads;
    float *m, *v, *master;
    size_t bytes_state;
    GPT2Hooks hooks;
    BackendEvent ready;     // the compute stream's work so far, for the communicators' streams to wait on
    uint64_t step_start, edp_start;
    double seconds;
} ExpertParallel;

// ---- the exchange (llmc/model/moe.h's MoEExchange)

// The rows were written by kernels on the compute stream; the communicator's stream reads them:
// it waits for an event recorded after them (as context parallelism's exchanges do, cp_core.h).
// Each collective returns with its stream synchronised, so the results are in place after it.
static inline void ep_comm_ready(ExpertParallel* ep, Comm* c) {
    backend_event_record(ep->ready);
    comm_wait_event(c, ep->ready);
}

static inline void ep_counts(void* ctx, const int* send, int* recv, int El) {
    ExpertParallel* ep = (ExpertParallel*)ctx;   // a few ints: the native call, not counted
    MPI_Alltoall(send, El, MPI_INT, recv, El, MPI_INT, ep->comm.mpi);
}
static inline void ep_rows(void* ctx, const floatX* send, const size_t* sendcounts, const size_t* sdispls, floatX* recv,
                           const size_t* recvcounts, const size_t* rdispls) {
    ExpertParallel* ep = (ExpertParallel*)ctx;
    double t0 = trace_now();
    ep_comm_ready(ep, &ep->comm);
    if (ep->use_ring) { alltoallv_pairwise(&ep->comm, send, sendcounts, sdispls, recv, recvcounts, rdispls, COMM_FLOATX); }
    else { alltoallv_native(&ep->comm, send, sendcounts, sdispls, recv, recvcounts, rdispls, COMM_FLOATX); }
    ep->seconds += trace_now() - t0;
    trace_event("all-to-all (experts)", 5, t0);
}

// ---- the mlp op: MoE blocks through the exchange, dense blocks as before

static inline void ep_mlp_forward(void* ctx, const OpAt* at, MLPActs* a, const floatX* inp, const BlockWeights* w, int C,
                                  int H) {
    ExpertParallel* ep = (ExpertParallel*)ctx;
    if (!gpt2_layer_is_moe(&at->model->config, at->layer)) { op_mlp_forward(NULL, at, a, inp, w, C, H); return; }
    moe_forward(at->model, at, a->out, inp, w, C, H, &ep->xch);
}
static inline void ep_mlp_backward(void* ctx, const OpAt* at, floatX* dinp, const floatX* dout, const MLPActs* a,
                                   const floatX* inp, const BlockWeights* w, BlockWeights* g, floatX* dh, int C, int H) {
    ExpertParallel* ep = (ExpertParallel*)ctx;
    if (!gpt2_layer_is_moe(&at->model->config, at->layer)) { op_mlp_backward(NULL, at, dinp, dout, a, inp, w, g, dh, C, H); return; }
    moe_backward(at->model, at, dinp, dout, inp, w, g, C, H, &ep->xch);
}

// ---- the expert gradients: ep's buffer (a placement hook points the passes at it)

static inline void ep_block_backward_begin(void* ctx, int l, BlockWeights* w, BlockWeights* g) {
    (void)w;
    ExpertParallel* ep = (ExpertParallel*)ctx;
    GPT2* m = ep->model;
    if (!gpt2_layer_is_moe(&m->config, l)) { return; }
    // the block's slices, laid out as in the flat buffer, shifted to ep's buffer
    BlockWeights flat = block_weights_in(m->params_memory, m->param_info, &m->place, l);
    for (int i = FIRST_EXPERT_TENSOR; i < NUM_PARAMETER_TENSORS; i++) {
        int k = table_block_tensor(i);
        *block_tensor(g, k) = ep->grads + (*block_tensor(&flat, k) - (m->params_memory + ep->offset));
    }
}

// dp's update asks (dp_core.h's ExpertOwners): average over the replicas of the same experts,
// divided by ep (the gradient already sums over the ep group's tokens); the squared norm of the
// experts summed over the ep group (each rank's are different ones)
static inline void ep_reduce(void* ctx) {
    ExpertParallel* ep = (ExpertParallel*)ctx;
    Comm* group = &ep->edp;   // the replicas of this rank's experts (all dp ranks would mix different experts)
    if (group->size > 1) {
        ep_comm_ready(ep, group);
        if (ep->use_ring) { allreduce_ring(group, ep->grads, ep->grads, ep->count, COMM_FLOATX, COMM_AVG); }
        else { allreduce_native(group, ep->grads, ep->grads, ep->count, COMM_FLOATX, COMM_AVG); }
    }
    moe_scale(ep->grads, ep->count, (float)group->size / ep->dp);   // the average over edp, divided by ep
}
static inline double ep_sum_norm(void* ctx, double sq) {
    MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, ((ExpertParallel*)ctx)->comm.mpi);   // 8 bytes, not counted
    return sq;
}

// Collective over the data-parallel group `dp_comm`, after dp_init: the ep and edp groups, the
// mlp op, the expert gradients and their optimizer state.
static inline void ep_init(ExpertParallel* ep, GPT2* model, Comm* dp_comm, DataParallel* dp, int use_ring) {
    memset((void*)ep, 0, sizeof(*ep));
    int n = model->place.ep, r = dp_comm->rank;
    if (dp_comm->size % n != 0) {
        die("--ep %d does not divide the %d data-parallel ranks: the ep groups are formed from them", n, dp_comm->size);
    }
    ep->model = model;
    ep->ep = n;
    ep->dp = dp_comm->size;
    ep->use_ring = use_ring;
    ep->dp_comm = dp_comm;
    ep->comm = comm_split(dp_comm, r / n, r % n, "ep");
    ep->edp = comm_split(dp_comm, r % n, r / n, "edp");
    ep->rank = ep->comm.rank;
    if (ep->rank != model->place.ep_rank) { die("expert parallelism: ep rank %d, but the model holds ep shard %d", ep->rank, model->place.ep_rank); }
#ifdef LLMC_CUDA_COMM
    comm_enable_device(&ep->comm, 0, 0);   // device rows, on the compute thread (a blocking stream, as tp's)
    comm_enable_device(&ep->edp, 0, 0);
#endif
    ep->ready = backend_event_create();
    ep->xch = MoEExchange{ep, n, ep->rank, ep_counts, ep_rows};
    model->ops.mlp.ctx = ep;
    model->ops.mlp.forward = ep_mlp_forward;
    model->ops.mlp.backward = ep_mlp_backward;
    // the expert tensors (the last of the table) and their state
    ep->offset = model->param_info[FIRST_EXPERT_TENSOR].offset;
    ep->count = model->num_parameters - ep->offset;
    ep->grads = (floatX*)device_malloc(ep->count * sizeof(floatX));
    device_memset_zero(ep->grads, ep->count * sizeof(floatX));
    ep->m = (float*)device_malloc(ep->count * sizeof(float));
    ep->v = (float*)device_malloc(ep->count * sizeof(float));
    device_memset_zero(ep->m, ep->count * sizeof(float));
    device_memset_zero(ep->v, ep->count * sizeof(float));
    ep->bytes_state = ep->count * (sizeof(floatX) + 8);
    if (BACKEND_MASTER_WEIGHTS) {
        ep->master = (float*)device_malloc(ep->count * sizeof(float));
        convert_floatX_to_float(ep->master, model->params_memory + ep->offset, ep->count);
        ep->bytes_state += ep->count * 4;
    }
    dp->experts.ctx = ep;
    dp->experts.reduce = ep_reduce;
    dp->experts.sum_norm = ep_sum_norm;
    for (int i = FIRST_EXPERT_TENSOR; i < NUM_PARAMETER_TENSORS; i++) {
        const ParamInfo* p = &model->param_info[i];
        size_t o = p->offset - ep->offset;
        dp->experts.segments.push_back({i, model->params_memory + p->offset, ep->grads + o, ep->m + o, ep->v + o,
                                        ep->master ? ep->master + o : NULL, p->numel, p->offset});
    }
    ep->hooks = GPT2Hooks{};
    ep->hooks.name = "expert parallel: expert gradients";
    ep->hooks.ctx = ep;
    ep->hooks.block_backward_begin = ep_block_backward_begin;
    gpt2_add_hooks(model, &ep->hooks);
}

static inline void ep_step_begin(ExpertParallel* ep) {
    device_memset_zero(ep->grads, ep->count * sizeof(floatX));
    ep->step_start = ep->comm.bytes_sent;
    ep->edp_start = ep->edp.bytes_sent;
    ep->seconds = 0.0;
}

static inline void ep_free(ExpertParallel* ep) {
    backend_event_destroy(ep->ready);
    device_free(ep->grads);
    device_free(ep->m);
    device_free(ep->v);
    if (ep->master) { device_free(ep->master); }
    comm_free(&ep->comm);
    comm_free(&ep->edp);
}

// ---- the formulas (the trainer prints them beside what it counted; the planner, llmc/planner/search.h, predicts with them)

// the expert parameters a rank holds: Lm E/ep experts of 8 C^2/tp + 4 C/tp + C
static inline size_t ep_formula_expert_params(const GPT2Config* c, const GPT2Place* pl) {
    return (size_t)gpt2_moe_layers(c) * (c->num_experts / pl->ep) * moe_expert_params(c, pl->tp);
}
// their state: gradients (a bytes), m and v (fp32), the master weights where the backend keeps them
static inline size_t ep_formula_state_bytes(size_t count) {
    return count * (sizeof(floatX) + 8) + (BACKEND_MASTER_WEIGHTS ? count * 4 : 0);
}
// the expert gradients' all-reduce over the edp ranks (ring), rank edp_rank of edp
static inline uint64_t ep_formula_edp_bytes(size_t count, int edp, int edp_rank) {
    return edp > 1 ? allreduce_ring_volume(count, COMM_FLOATX, edp, edp_rank).bytes : 0;
}
// the all-to-all of a step with `pairs` (token, choice) pairs on this rank, balanced routing and
// nothing dropped: each pair leaves with probability (ep-1)/ep, in 4 exchanges of C values. Exact
// when every token goes to every expert (k = E, capacity >= 1): then (ep-1)/ep of them leave.
static inline double ep_formula_balanced_bytes(size_t C, double pairs, int ep) {
    return 4.0 * sizeof(floatX) * C * pairs * (ep - 1) / ep;
}

// ---- what the trainer prints

// parameters of the rank: dense (replicated over dp) and expert (E/ep experts of each MoE block)
static inline void ep_print_plan(const ExpertParallel* ep) {
    const GPT2* m = ep->model;
    const GPT2Config* c = &m->config;
    size_t a = sizeof(floatX);
    size_t formula = ep_formula_expert_params(c, &m->place);
    printf("expert parallel ep %d (ep groups of consecutive dp ranks, edp %d replicas of each expert): this rank holds experts "
           "[%d, %d) of %d\n", ep->ep, ep->edp.size, ep->rank * c->num_experts / ep->ep, (ep->rank + 1) * c->num_experts / ep->ep,
           c->num_experts);
    printf("  parameters per rank      dense %zu (replicated over dp) + expert %zu (formula Lm E/ep (8 C^2/tp + 4 C/tp + C) = %zu, %s)\n",
           ep->offset, ep->count, formula, formula == ep->count ? "equal" : "DIFFERENT");
    printf("  expert state per rank    %9.3f MiB (gradients %zu a + m, v%s, a = %zu)\n", ep->bytes_state / 1048576.0, ep->count,
           ep->master ? " + master" : "", a);
    printf("ep comm      %s all-to-all-v of the token rows on the ep group; expert gradients averaged over edp / ep\n",
           ep->use_ring ? "pairwise (ours: bytes counted)" : "native (bytes not counted)");
}

// the line under each step's line: the all-to-all bytes against the formula from the routing
static inline void ep_report_step(const ExpertParallel* ep) {
    const GPT2* m = ep->model;
    size_t a = sizeof(floatX), C = (size_t)m->config.channels;
    uint64_t sent = ep->comm.bytes_sent - ep->step_start, want = m->moe->step_rows_remote * C * a;
    uint64_t edp_sent = ep->edp.bytes_sent - ep->edp_start;
    uint64_t edp_want = ep_formula_edp_bytes(ep->count, ep->edp.size, ep->edp.rank);
    double balanced = ep_formula_balanced_bytes(C, (double)m->moe->step_pairs, ep->ep);
    if (ep->use_ring) {
        printf("  ep comm | all-to-all sent %9.3f MiB (formula 2 a C (rows out + rows in) %9.3f MiB, %s; balanced "
               "%9.3f MiB) | edp all-reduce %9.3f MiB (formula %9.3f MiB, %s) | %.1f ms\n", sent / 1048576.0, want / 1048576.0,
               sent == want ? "equal" : "DIFFERENT", balanced / 1048576.0, edp_sent / 1048576.0, edp_want / 1048576.0,
               edp_sent == edp_want ? "equal" : "DIFFERENT", ep->seconds * 1e3);
    } else {
        printf("  ep comm | native: bytes not counted (formula %9.3f MiB, balanced %9.3f MiB) | %.1f ms\n", want / 1048576.0,
               balanced / 1048576.0, ep->seconds * 1e3);
    }
}

// The line under each step's line: tokens per expert and drops of the step, summed over the
// data-parallel ranks `comm` (MPI_COMM_NULL: this rank's), and the aux loss (their mean).
static inline void moe_report_step(const GPT2* model, MPI_Comm comm) {
    const MoE* m = model->moe;
    std::vector<long> tokens(m->step_expert), blocks(m->step_block_expert);
    long counts[2] = {m->step_dropped, m->step_pairs};
    double aux = m->step_aux / m->micro_n;
    int ranks = 1;
    if (comm != MPI_COMM_NULL) {
        MPI_Allreduce(MPI_IN_PLACE, tokens.data(), (int)tokens.size(), MPI_LONG, MPI_SUM, comm);
        MPI_Allreduce(MPI_IN_PLACE, blocks.data(), (int)blocks.size(), MPI_LONG, MPI_SUM, comm);
        MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_LONG, MPI_SUM, comm);
        MPI_Allreduce(MPI_IN_PLACE, &aux, 1, MPI_DOUBLE, MPI_SUM, comm);
        MPI_Comm_size(comm, &ranks);
    }
    printf("      moe | tokens per expert [");
    for (size_t e = 0; e < tokens.size(); e++) { printf("%s%ld", e ? " " : "", tokens[e]); }
    // load imbalance: the busiest expert's share against the mean, of all blocks and of the worst block
    auto imbalance = [](const long* t, int E) {
        long mx = 0, sum = 0;
        for (int e = 0; e < E; e++) { mx = std::max(mx, t[e]); sum += t[e]; }
        return sum ? (double)mx * E / sum : 0.0;
    };
    double worst = 0.0;
    for (int b = 0; b < m->blocks; b++) { worst = std::max(worst, imbalance(&blocks[(size_t)b * m->E], m->E)); }
    printf("] | max/mean %.2f (worst block %.2f) | dropped %ld of %ld pairs (%.1f%%) | aux loss %.6f\n",
           imbalance(tokens.data(), m->E), worst, counts[0], counts[1], counts[1] ? 100.0 * counts[0] / counts[1] : 0.0, aux / ranks);
}
