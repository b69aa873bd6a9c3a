// Expert parallelism: the E experts of every MoE block (llmc/model/moe_block.h) split over ep ranks, and each
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
// One MoE block, forward (ep 2: rank 0 holds experts 0,1, rank 1 holds 2,3):
//
//   rank 0: tokens ─ route ─> rows for [e0 e1 | e2 e3] ─┐ all-to-all ┌─> rank 0: e0, e1 on both ranks' rows ─┐
//   rank 1: tokens ─ route ─> rows for [e0 e1 | e2 e3] ─┘ (dispatch) └─> rank 1: e2, e3 on both ranks' rows ─┤
//   out[t] = sum_j g_tj y_tj <── combine (each rank its tokens) <── y in send order <── all-to-all (return) ─┘
//
//   1. route its B T tokens (host, moe_block.h): which expert, kept or dropped, the rows per (rank, expert)
//   2. exchange the counts: every rank learns how many rows it will receive per (source, expert)
//   3. dispatch: all-to-all-v of the kept pairs' token rows, to the experts' ranks
//   4. run its E/ep experts on what arrived (rows of all ep ranks' tokens, expert by expert)
//   5. return: all-to-all-v of the expert outputs back to the tokens' ranks
//   6. combine: out[t] = sum_j g_tj y_tj on the token's own rank (moe_block.h)
// Steps 2 to 5 are ep_experts_forward, below. The backward (ep_experts_backward) runs the same
// exchanges in the same order, carrying gradients.
//
// Bytes per MoE block and micro-batch that a rank sends (a = bytes per element, C channels):
// 2 a C (rows it dispatches to other ranks + rows other ranks dispatched to it), over four
// exchanges (forward: its rows out, the others' back; backward: the same with gradients).
// Balanced routing, nothing dropped: 4 a C k B T (ep-1)/ep (llmc/parallel/ep_accounting.h).
//
// An expert's gradient on a rank already sums over the tokens of a whole ep group: it is
// averaged over its edp replicas and divided by ep (ep_reduce, below).
#pragma once

#include "ep_core.h"   // ExpertParallel

// The rows were written by kernels on the compute stream; the communicator's stream reads them:
// it waits for an event recorded after them (as context parallelism's exchanges do, cp_core.h).
// Each collective returns with its stream synchronised, so the results are in place after it.
static inline void ep_comm_ready(ExpertParallel* ep, Comm* c) {
    backend_event_record(ep->ready);
    comm_wait_event(c, ep->ready);
}

// counts and displacements (in elements of rows of C) of an all-to-all-v from per-(peer, expert) rows
static inline void ep_peer_counts(const std::vector<int>& rows, int ep, int El, size_t C, std::vector<size_t>* cnt,
                                  std::vector<size_t>* displ) {
    cnt->assign(ep, 0);
    displ->assign(ep, 0);
    size_t off = 0;
    for (int s = 0; s < ep; s++) {
        size_t n = 0;
        for (int e = 0; e < El; e++) { n += (size_t)rows[(size_t)s * El + e]; }
        (*cnt)[s] = n * C;
        (*displ)[s] = off;
        off += n * C;
    }
}

// All-to-all-v of rows of C: src holds out_rows[(peer, expert)] rows per peer and expert, in that
// order; dst receives in_rows from each peer, source-major
static inline void ep_alltoall_rows(const MoEExchange* xch, MoE* m, const std::vector<int>& out_rows,
                                    const std::vector<int>& in_rows, const floatX* src, floatX* dst, int C) {
    ExpertParallel* ep = (ExpertParallel*)xch->ctx;
    std::vector<size_t> sc, sd, rc, rd;
    ep_peer_counts(out_rows, xch->size, m->El, (size_t)C, &sc, &sd);
    ep_peer_counts(in_rows, xch->size, m->El, (size_t)C, &rc, &rd);
    for (int s = 0; s < xch->size; s++) { if (s != xch->rank) { m->step_rows_remote += sc[s] / C; } }   // the bytes' formula
    double t0 = trace_now();
    ep_comm_ready(ep, &ep->comm);
    if (ep->use_ring) { alltoallv_pairwise(&ep->comm, src, sc.data(), sd.data(), dst, rc.data(), rd.data(), COMM_FLOATX); }
    else { alltoallv_native(&ep->comm, src, sc.data(), sd.data(), dst, rc.data(), rd.data(), COMM_FLOATX); }
    ep->seconds += trace_now() - t0;
    trace_event("all-to-all (experts)", 5, t0);
}

// 2. the counts: r->recv_counts[src El + e] = the rows rank src sends this rank's expert e. Then
// the order rows arrive in (source-major: rank 0's rows for expert 0, 1, ..., then rank 1's) to
// expert-major (expert 0's rows from rank 0, 1, ..., then expert 1's): perm[i] = the received row
// of expert-major row i, inv its inverse; r->expert_rows = each local expert's first row.
static inline void ep_exchange_counts(const MoEExchange* xch, MoERouting* r, int El, int layer) {
    ExpertParallel* ep = (ExpertParallel*)xch->ctx;
    r->recv_counts.assign((size_t)xch->size * El, 0);   // a few ints: the native call, not counted
    MPI_Alltoall(r->send_counts.data(), El, MPI_INT, r->recv_counts.data(), El, MPI_INT, ep->comm.mpi);
    std::vector<int> src_start((size_t)xch->size * El);   // received row where (src, e) starts
    int n = 0;
    for (int s = 0; s < xch->size; s++) {
        for (int e = 0; e < El; e++) { src_start[(size_t)s * El + e] = n; n += r->recv_counts[(size_t)s * El + e]; }
    }
    r->nrecv = n;
    if ((size_t)r->nrecv > r->cap_recv) { die("MoE block %d: %d rows received, the buffers hold %zu", layer, r->nrecv, r->cap_recv); }
    std::vector<int> perm(n), inv(n);
    r->expert_rows.assign(El + 1, 0);
    int i = 0;
    for (int e = 0; e < El; e++) {
        r->expert_rows[e] = i;
        for (int s = 0; s < xch->size; s++) {
            for (int q = 0; q < r->recv_counts[(size_t)s * El + e]; q++, i++) {
                perm[i] = src_start[(size_t)s * El + e] + q;
                inv[perm[i]] = i;
            }
        }
    }
    r->expert_rows[El] = i;
    copy_host_to_device(r->perm_d, perm.data(), perm.size() * sizeof(int));
    copy_host_to_device(r->inv_d, inv.data(), inv.size() * sizeof(int));
}

// 3. dispatch: rows in send order to the experts' ranks, which get them expert-major in dst
static inline void ep_to_experts(const MoEExchange* xch, MoE* m, MoERouting* r, const floatX* src, floatX* dst, int C) {
    ep_alltoall_rows(xch, m, r->send_counts, r->recv_counts, src, m->recv, C);
    moe_gather_rows(dst, m->recv, r->perm_d, r->nrecv, C);   // source-major -> expert-major
}
// 5. return: expert-major rows back to the tokens' ranks, in send order in dst
static inline void ep_to_tokens(const MoEExchange* xch, MoE* m, MoERouting* r, const floatX* src, floatX* dst, int C) {
    moe_gather_rows(m->recv, src, r->inv_d, r->nrecv, C);   // expert-major -> source-major
    ep_alltoall_rows(xch, m, r->recv_counts, r->send_counts, m->recv, dst, C);
}

// Steps 2 to 5 of the forward (MoEExchange.forward): y (send order) = the experts' outputs on x's kept rows
static inline void ep_experts_forward(const MoEExchange* xch, const OpAt* at, MoERouting* r, const floatX* x,
                                      const BlockWeights* w, floatX* y, int C, int H) {
    MoE* m = at->model->moe;
    moe_gather_rows(m->send, x, r->send_rows_d, r->nsend, C);   // the kept pairs' rows, in send order
    ep_exchange_counts(xch, r, m->El, at->layer);
    ep_to_experts(xch, m, r, m->send, r->xin, C);
    moe_experts_forward(at, r, w, m->buf, C, H);
    ep_to_tokens(xch, m, r, m->buf, y, C);
}
// ... and of the backward (MoEExchange.backward), with the dispatch's counts: dy out, dx back
static inline void ep_experts_backward(const MoEExchange* xch, const OpAt* at, MoERouting* r, const BlockWeights* w,
                                       BlockWeights* g, floatX* dy, floatX* dx, int C, int H) {
    MoE* m = at->model->moe;
    ep_to_experts(xch, m, r, dy, m->buf, C);
    moe_experts_backward(at, r, w, g, m->buf, dy, C, H);   // dy was sent: its buffer takes the experts' dx
    ep_to_tokens(xch, m, r, dy, dx, C);
}

// The mlp op: MoE blocks through the exchange, dense blocks as before
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

// The expert gradients, and the setup (ep_init).
//
// A dense weight's gradient is averaged over dp as before. An expert's weights live on dp/ep
// ranks (its edp group), and its gradient on each of them already sums over the tokens of a
// whole ep group: the mean over the global batch is the average over edp divided by ep.
// Averaging over all dp ranks instead would mix different experts' gradients (doc/expert-parallel.md
// shows the equivalence test failing). Data parallelism (llmc/parallel/dp.h) leaves the expert
// tensors out of its buckets (skip_experts); ep keeps their gradients in a buffer of its own (a
// placement hook points the passes at it), reduces them over edp before the update and hands
// their segments to dp's update (ExpertOwners), so one clip covers the model.
// the block's expert tensors' gradients: ep's buffer, laid out as in the flat buffer
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
    ep->xch = MoEExchange{ep, n, ep->rank, ep_experts_forward, ep_experts_backward};
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

static inline void ep_zero_grad(ExpertParallel* ep) { device_memset_zero(ep->grads, ep->count * sizeof(floatX)); }

// before a step: its statistics from zero
static inline void ep_step_begin(ExpertParallel* ep) {
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

#include "ep_accounting.h"   // the formulas, and what the trainer prints
