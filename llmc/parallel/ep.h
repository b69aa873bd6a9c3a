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
// averaged over its edp replicas and divided by ep (llmc/parallel/ep_gradients.h).
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

#include "ep_gradients.h"    // the expert gradients over the edp group; ep_init, ep_zero_grad, ep_step_begin, ep_free
#include "ep_accounting.h"   // the formulas, and what the trainer prints
