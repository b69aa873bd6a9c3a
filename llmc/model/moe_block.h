// Mixture of experts: the MLP of every N-th block becomes E expert MLPs and a router that sends
// each token to k of them (Shazeer et al. 2017; GShard; Switch Transformer, k = 1). The lecture
// "LLM Pre-training and Beyond", slide "Expert Parallelism applied on Mixture-of-Experts".
// Included by llmc/model/gpt2.h (it needs GPT2).
//
//                    router: p = softmax(x Wr^T)         top-k experts, gates g
//   x (B T, C) ──┬──> [ e = argtop_k p ] ──> dispatch: each kept (token, choice) row goes to its
//                │                           expert's rows (another rank's, with --ep: ep.h)
//                │        expert 0: rows ──> fc ─ gelu ─ fcproj ──┐
//                │        expert 1: rows ──> fc ─ gelu ─ fcproj ──┤ combine:
//                │        ...                                     ├─> out[t] = sum_j g_tj y_tj
//                └────────────────────────────────────────────────┘   (dropped choices add 0)
//
// For token t with router probabilities p_t = softmax(Wr x_t) over the E experts:
//   e_t1 .. e_tk  the k largest p_t (ties: the lower expert first), in decreasing order
//   gates         k = 1: g = p_t[e_t1] (Switch: the router gets the task's gradient through g)
//                 k > 1: g_j = p_t[e_tj] / sum_i p_t[e_ti] (renormalised over the chosen k)
//   capacity      an expert takes at most cap = ceil(factor T k / E) pairs of a sequence; a pair
//                 over it is DROPPED and the token keeps its residual stream (moe_routing.h)
//   aux loss      Switch's load balancing, alpha E sum_i f_i P_i per sequence (moe_routing.h)
//   loss          cross-entropy + the sum over MoE blocks of the mean over the batch's sequences
// A routing group of one sequence makes the result independent of how sequences are spread over
// ranks: a data- or expert-parallel run routes and drops exactly as one rank does.
//
// Cost per MoE block, for N = B T tokens: router N E C MACs; experts k N (kept pairs) x 8 C^2
// MACs, the dense MLP's k times, with E times its parameters (active: dense + k experts).
//
// The routing decisions are made on the host from the probabilities (B T E floats copied back):
// the all-to-all needs the counts on the host anyway, and the same C++ code decides for both
// backends. The per-row work (gather, the experts, combine, their backward) runs on the device.
// The experts' linears go through model->ops.linear (sites FC and FCPROJ), so a tensor-parallel
// linear splits every expert as it splits the dense MLP. Generation (slot -1) keeps every pair.
#pragma once

#include <math.h>
#include <vector>
#include "../common.h"
#include "../backend.h"
#include "params.h"
#include "ops.h"
#include "moe_routing.h"   // capacity, the aux loss, the send order (MoERouting)
#include "moe_buffers.h"   // the routing states and scratch (MoE)
#include "moe_stats.h"     // what the blocks count and print
#include "gpt2_core.h"   // GPT2

// Where the experts are. ctx NULL: all on this rank. Expert parallelism (llmc/parallel/ep.h) holds
// E/ep of them per rank of an ep group (size, rank): its forward sends the kept rows to their
// experts' ranks, runs this rank's experts on what arrives and brings the outputs back.
typedef struct MoEExchange {
    void* ctx;
    int size, rank;   // the ep group
    // y (send order) = the experts' outputs on x's kept rows
    void (*forward)(const struct MoEExchange* xch, const OpAt* at, MoERouting* r, const floatX* x, const BlockWeights* w,
                    floatX* y, int C, int H);
    // dx (send order) = the gradient of the experts' inputs from dy (send order, consumed); g accumulates
    void (*backward)(const struct MoEExchange* xch, const OpAt* at, MoERouting* r, const BlockWeights* w, BlockWeights* g,
                     floatX* dy, floatX* dx, int C, int H);
} MoEExchange;

// Each token's k experts, the largest p first (the lower expert on a tie), and its gates
static inline void moe_route_topk(MoERouting* r, const float* p, int N, int T, int E, int k) {
    r->N = N;
    r->T = T;
    r->topk.assign((size_t)N * k, 0);
    r->gates.assign((size_t)N * k, 0.0f);
    for (int t = 0; t < N; t++) {
        const float* pt = p + (size_t)t * E;
        int* e = &r->topk[(size_t)t * k];
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int i = 0; i < E; i++) {
                bool taken = false;
                for (int q = 0; q < j; q++) { taken |= e[q] == i; }
                if (!taken && (best < 0 || pt[i] > pt[best])) { best = i; }
            }
            e[j] = best;
        }
        float sum = 0.0f;
        for (int j = 0; j < k; j++) { sum += pt[e[j]]; }
        for (int j = 0; j < k; j++) { r->gates[(size_t)t * k + j] = k == 1 ? pt[e[j]] : pt[e[j]] / sum; }
    }
}

// The router: probabilities on the device, decisions on the host (top-k, gates, which pairs
// capacity keeps, the order the kept rows are sent in), copied to the device for the kernels.
static inline MoERouting* moe_router_forward(GPT2* model, const OpAt* at, const floatX* x, const BlockWeights* w, int C,
                                             int H) {
    MoE* m = model->moe;
    const GPT2Config* c = &model->config;
    int B = at->B, T = at->T, N = B * T, E = m->E, k = m->k;
    MoERouting* r = moe_routing_at(model, at, H);
    matmul_forward(m->logits, x, w->routerw, NULL, B, T, C, E);
    moe_softmax(r->probs, m->logits, N, E);
    std::vector<float> p((size_t)N * E);
    copy_device_to_host(p.data(), r->probs, p.size() * sizeof(float));
    int training = at->slot >= 0;
    // the mean over the step's groups, times the loss scale the rest of the backward carries (llmc/train/loss_scale.h)
    float grad_scale = model->loss_scale / ((float)B * m->micro_n);
    moe_route_topk(r, p.data(), N, T, E, k);
    moe_route_keep(r, p.data(), B, T, E, k, training ? moe_capacity(c, T) : -1, c->moe_aux, grad_scale, m->ep, m->El);
    moe_routing_upload(r);
    if (training) { moe_count_routing(model, at->layer, r, B); }
    return r;
}

// This rank's experts, each on its rows (expert-major: expert e's start at r->expert_rows[e]):
// fc -> GELU -> fcproj of the rows r->xin into y
static inline void moe_experts_forward(const OpAt* at, MoERouting* r, const BlockWeights* w, floatX* y, int C, int H) {
    const GPT2Ops* ops = &at->model->ops;
    MoE* m = at->model->moe;
    for (int e = 0; e < m->El; e++) {
        int o = r->expert_rows[e], n = r->expert_rows[e + 1] - o;
        if (n == 0) { continue; }
        OpAt ate = *at;
        ate.B = 1;
        ate.T = ate.Ts = n;
        ops->linear.forward(ops->linear.ctx, &ate, LINEAR_FC, r->fch + (size_t)o * H, r->xin + (size_t)o * C,
                            w->expfcw + (size_t)e * H * C, w->expfcb + (size_t)e * H, C, H);
        gelu_forward(r->fch_gelu + (size_t)o * H, r->fch + (size_t)o * H, (size_t)n * H);
        ops->linear.forward(ops->linear.ctx, &ate, LINEAR_FCPROJ, y + (size_t)o * C, r->fch_gelu + (size_t)o * H,
                            w->expfcprojw + (size_t)e * C * H, w->expfcprojb + (size_t)e * C, H, C);
    }
    if (at->slot >= 0) { moe_count_expert_calls(m, r); }
}

// their backward: dx (expert-major) from dy (expert-major); the expert weight gradients in g accumulate
static inline void moe_experts_backward(const OpAt* at, MoERouting* r, const BlockWeights* w, BlockWeights* g,
                                        const floatX* dy, floatX* dx, int C, int H) {
    const GPT2Ops* ops = &at->model->ops;
    MoE* m = at->model->moe;
    for (int e = 0; e < m->El; e++) {
        int o = r->expert_rows[e], n = r->expert_rows[e + 1] - o;
        if (n == 0) { continue; }
        OpAt ate = *at;
        ate.B = 1;
        ate.T = ate.Ts = n;
        ops->linear.backward(ops->linear.ctx, &ate, LINEAR_FCPROJ, m->dh, g->expfcprojw + (size_t)e * C * H,
                             g->expfcprojb + (size_t)e * C, dy + (size_t)o * C, r->fch_gelu + (size_t)o * H,
                             w->expfcprojw + (size_t)e * C * H, H, C);
        gelu_backward(m->dh, r->fch + (size_t)o * H, m->dh, (size_t)n * H);
        ops->linear.backward(ops->linear.ctx, &ate, LINEAR_FC, dx + (size_t)o * C, g->expfcw + (size_t)e * H * C,
                             g->expfcb + (size_t)e * H, m->dh, r->xin + (size_t)o * C, w->expfcw + (size_t)e * H * C, C, H);
    }
}

// Every expert on this rank: the kept rows, gathered in send order, are already expert-major
static inline void moe_experts_here(MoE* m, MoERouting* r) {
    r->nrecv = r->nsend;
    r->expert_rows.assign(m->El + 1, 0);
    for (int e = 0; e < m->El; e++) { r->expert_rows[e + 1] = r->expert_rows[e] + r->send_counts[e]; }
}

// out (B T, C) = the MoE MLP of x (B T, C). x is ln2's output, w the block's weights.
static inline void moe_forward(GPT2* model, const OpAt* at, floatX* out, const floatX* x, const BlockWeights* w, int C,
                               int H, const MoEExchange* xch) {
    MoE* m = model->moe;
    int N = at->B * at->T, k = m->k;
    MoERouting* r = moe_router_forward(model, at, x, w, C, H);
    // dispatch, the experts, and their outputs back in send order (r->yret)
    if (xch->ctx == NULL) {
        moe_experts_here(m, r);
        moe_gather_rows(r->xin, x, r->send_rows_d, r->nsend, C);
        moe_experts_forward(at, r, w, r->yret, C, H);
    } else {
        xch->forward(xch, at, r, x, w, r->yret, C, H);
    }
    // combine: out[t] = sum over t's kept pairs of gate x expert output
    moe_combine(out, r->yret, r->slot_d, r->gates_d, N, k, C, 0);
}

// dinp (B T, C) = the gradient of x (overwritten); the expert and router weight gradients in g
// accumulate. dout: the gradient of the block's MLP output.
static inline void moe_backward(GPT2* model, const OpAt* at, floatX* dinp, const floatX* dout, const floatX* x,
                                const BlockWeights* w, BlockWeights* g, int C, int H, const MoEExchange* xch) {
    MoE* m = model->moe;
    int B = at->B, T = at->T, N = B * T, E = m->E, k = m->k;
    MoERouting* r = moe_routing_at(model, at, H);
    // combine's backward: each kept pair's output gradient g dout[t] (send order), the gates' gradient
    moe_combine_backward(m->send, m->dgate, dout, r->yret, r->slot_d, r->gates_d, N, k, C);
    // the experts' backward: each kept pair's input gradient, in send order, into m->buf
    if (xch->ctx == NULL) {
        moe_experts_backward(at, r, w, g, m->send, m->buf, C, H);
    } else {
        xch->backward(xch, at, r, w, g, m->send, m->buf, C, H);
    }
    // router: the gates' and the aux loss's gradient through the softmax, then the router matmul
    moe_router_backward(m->logits, r->probs, r->topk_d, m->dgate, r->aux_grad_d, N, E, k, T);
    matmul_backward(dinp, g->routerw, NULL, m->logits, x, w->routerw, B, T, C, E);
    // and every kept pair's input gradient back to its token
    moe_combine(dinp, m->buf, r->slot_d, NULL, N, k, C, 1);
}

// The auxiliary load-balancing loss of the last forward on a slot (0 for a dense model)
static inline float gpt2_aux_loss(const GPT2* model, int slot) {
    return model->moe ? moe_aux_loss(model->moe, slot, model->acts[slot].B) : 0.0f;
}
