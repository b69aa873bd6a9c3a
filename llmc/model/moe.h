// Mixture of experts: the MLP of every N-th block becomes E expert MLPs and a router that sends
// each token to k of them (Shazeer et al. 2017; GShard; Switch Transformer, k = 1). The lecture
// "LLM Pre-training and Beyond", slide "Expert Parallelism applied on Mixture-of-Experts".
// Included by llmc/model/gpt2.h (it needs GPT2).
//
//                    router: p = softmax(x Wr^T)         top-k experts, gates g
//   x (B T, C) ──┬──> [ e = argtop_k p ] ──> dispatch: each kept (token, choice) row goes to its
//                │                           expert's buffer (another rank's, with --ep)
//                │        expert 0: rows ──> fc ─ gelu ─ fcproj ──┐
//                │        expert 1: rows ──> fc ─ gelu ─ fcproj ──┤ combine:
//                │        ...                                     ├─> out[t] = sum_j g_tj y_tj
//                └────────────────────────────────────────────────┘   (dropped choices add 0)
//
// Routing, for token t with router probabilities p_t = softmax(Wr x_t) over the E experts:
//   e_t1 .. e_tk  the k largest p_t (ties: the lower expert first), in decreasing order
//   gates         k = 1: g = p_t[e_t1] (Switch: the router gets the task's gradient through g)
//                 k > 1: g_j = p_t[e_tj] / sum_i p_t[e_ti] (renormalised over the chosen k)
//   capacity      a routing group is one sequence of T tokens: an expert takes at most
//                 cap = ceil(factor T k / E) of its (token, choice) pairs, first choices of every
//                 token first (j = 1 for t = 0..T-1, then j = 2, ...). A pair over capacity is
//                 DROPPED: it contributes nothing, the token keeps its residual stream.
//   aux loss      Switch's load balancing, per group: f_i = share of the T k pairs sent to expert i
//                 (before dropping), P_i = mean of p_t[i]; aux = alpha E sum_i f_i P_i, smallest
//                 (alpha) when both are uniform. f is a count (no gradient); the gradient reaches
//                 the router through P: d aux / d p_t[i] = alpha E f_i / T, which pushes probability
//                 away from the experts that already get more than their share.
//   loss          cross-entropy + the sum over MoE blocks of the mean over the batch's groups.
// A group of one sequence makes the result independent of how sequences are spread over ranks:
// a data- or expert-parallel run routes and drops exactly as one rank does.
//
// The routing decisions are made on the host from the probabilities (B T E floats copied back):
// the all-to-all needs the counts on the host anyway, and the same C++ code then decides for both
// backends. The per-row work (gather, the expert matmuls, combine, their backward) runs on the
// device. The experts' linears go through model->ops.linear (sites FC and FCPROJ), so a
// tensor-parallel linear splits every expert as it splits the dense MLP.
//
// Cost per MoE block, for N = B T tokens: router N E C MACs; experts k N (kept pairs) x 8 C^2 MACs,
// the dense MLP's k times, with E times its parameters (active parameters: dense + k experts).
// Memory saved per block: p (N E fp32), the expert inputs and hidden units of at most
// B cap E rows (the capacity bound), the k N gates, slots and expert outputs.
// Generation (the KV cache, slot -1) keeps every pair (no capacity, no aux), so that a row's
// completion does not depend on the rows beside it.
#pragma once

#include <math.h>
#include <vector>
#include "../common.h"
#include "../backend.h"
#include "params.h"
#include "ops.h"

// The token exchange of expert parallelism (llmc/parallel/ep.h); ctx NULL: one rank holds every
// expert and the exchange is the identity.
typedef struct {
    void* ctx;
    int size, rank;   // the ep group
    // every rank's rows per (peer, local expert): send[dst El + e] -> recv[src El + e]
    void (*counts)(void* ctx, const int* send, int* recv, int El);
    // all-to-all-v of rows of C floatX (counts and displacements in elements)
    void (*rows)(void* ctx, const floatX* send, const size_t* sendcounts, const size_t* sdispls, floatX* recv,
                 const size_t* recvcounts, const size_t* rdispls);
} MoEExchange;

// One MoE block's routing of one micro-batch: what the forward decided and saved for the backward.
typedef struct {
    int N, T, nsend, nrecv;          // tokens, tokens per group, rows sent, rows received
    std::vector<int> topk;           // N k chosen experts
    std::vector<float> gates;        // N k
    std::vector<int> slot;           // N k: row of the pair in the send buffer, -1 dropped
    std::vector<int> send_rows;      // nsend: the token of each row sent (expert-major order)
    std::vector<int> send_counts;    // ep El: rows to (rank, local expert)
    std::vector<int> recv_counts;    // ep El: rows from (rank, local expert)
    std::vector<int> expert_rows;    // El + 1: offsets of each local expert's rows (expert-major)
    std::vector<float> aux_grad;     // B E: d aux / d p of each group, scaled for the step
    double aux;                      // sum over the groups of aux_g
    // device
    float* probs;                    // N E
    int *topk_d, *slot_d, *send_rows_d, *perm_d, *inv_d;
    float *gates_d, *aux_grad_d;
    floatX *xin, *fch, *fch_gelu;    // nrecv rows, expert-major: the experts' inputs and hidden units
    floatX* yret;                    // nsend rows, send order: the experts' outputs, back home
    size_t cap_tokens, cap_send, cap_recv;   // what the buffers hold
} MoERouting;

typedef struct MoE {
    int E, El, k, ep;                // experts, this rank's, top-k, expert-parallel ranks
    int blocks;                      // the MoE blocks on this rank
    int slots;
    std::vector<MoERouting> routing; // slots x blocks
    MoERouting gen;                  // generation's, grown on demand
    // scratch shared by the blocks (forward and backward)
    floatX *logits, *send, *recv, *buf, *dh;
    float* dgate;
    size_t scratch_rows, scratch_tokens;
    size_t bytes_saved, bytes_scratch;   // device memory: saved for the backward, scratch
    int micro_n;                     // micro-batches of the step (the aux gradient's share)
    // statistics of the step (this rank's tokens)
    std::vector<long> step_expert;   // E: kept pairs per expert
    std::vector<long> step_block_expert;   // blocks x E: the same per MoE block (a collapse in one block shows)
    long step_dropped, step_pairs;
    std::vector<double> step_exchange;   // rows sent to other ranks, per exchange (formula input)
    uint64_t step_rows_remote;       // rows sent to other ep ranks (all four exchanges)
    double step_aux;                 // sum of the blocks' aux over the step's forwards
    std::vector<int> step_expert_calls;   // rows of each expert call of the step's forwards (tensor
                                     // parallelism's all-reduces inside the experts follow them)
} MoE;

static inline int moe_capacity(const GPT2Config* c, int T) {
    double cap = ceil((double)c->moe_capacity * T * c->moe_topk / c->num_experts);
    return cap < T ? (int)cap : T;   // an expert never gets more than the T tokens of a sequence (a huge factor: T)
}

// ---------------------------------------------------------------------------------------
// Buffers

static inline void moe_routing_free(MoERouting* r) {
    device_free(r->probs);
    device_free(r->topk_d);
    device_free(r->slot_d);
    device_free(r->send_rows_d);
    device_free(r->perm_d);
    device_free(r->inv_d);
    device_free(r->gates_d);
    device_free(r->aux_grad_d);
    device_free(r->xin);
    device_free(r->fch);
    device_free(r->fch_gelu);
    device_free(r->yret);
    r->probs = NULL;
    r->topk_d = r->slot_d = r->send_rows_d = r->perm_d = r->inv_d = NULL;
    r->gates_d = r->aux_grad_d = NULL;
    r->xin = r->fch = r->fch_gelu = r->yret = NULL;
}

// device memory of one routing state for `tokens` tokens in `groups` groups, nsend / nrecv rows
static inline size_t moe_routing_alloc(MoERouting* r, size_t tokens, size_t groups, size_t nsend, size_t nrecv, int E,
                                       int k, int C, int H) {
    size_t bytes = 0;
    auto take = [&bytes](size_t n, size_t el) { bytes += n * el; return device_malloc(n * el > 0 ? n * el : 1); };
    r->probs = (float*)take(tokens * E, sizeof(float));
    r->topk_d = (int*)take(tokens * k, sizeof(int));
    r->slot_d = (int*)take(tokens * k, sizeof(int));
    r->gates_d = (float*)take(tokens * k, sizeof(float));
    r->send_rows_d = (int*)take(nsend, sizeof(int));
    r->perm_d = (int*)take(nrecv, sizeof(int));
    r->inv_d = (int*)take(nrecv, sizeof(int));
    r->aux_grad_d = (float*)take(groups * E, sizeof(float));
    r->xin = (floatX*)take(nrecv * C, sizeof(floatX));
    r->fch = (floatX*)take(nrecv * H, sizeof(floatX));
    r->fch_gelu = (floatX*)take(nrecv * H, sizeof(floatX));
    r->yret = (floatX*)take(nsend * C, sizeof(floatX));
    r->cap_tokens = tokens;
    r->cap_send = nsend;
    r->cap_recv = nrecv;
    return bytes;
}

static inline void moe_scratch_free(MoE* m) {
    device_free(m->logits);
    device_free(m->send);
    device_free(m->recv);
    device_free(m->buf);
    device_free(m->dh);
    device_free(m->dgate);
    m->logits = m->send = m->recv = m->buf = m->dh = NULL;
    m->dgate = NULL;
}
static inline size_t moe_scratch_alloc(MoE* m, size_t tokens, size_t rows, int E, int k, int C, int H) {
    moe_scratch_free(m);
    size_t bytes = 0;
    auto take = [&bytes](size_t n, size_t el) { bytes += n * el; return device_malloc(n * el > 0 ? n * el : 1); };
    m->logits = (floatX*)take(tokens * E, sizeof(floatX));   // router logits, then their gradient
    m->dgate = (float*)take(tokens * k, sizeof(float));
    m->send = (floatX*)take(rows * C, sizeof(floatX));
    m->recv = (floatX*)take(rows * C, sizeof(floatX));
    m->buf = (floatX*)take(rows * C, sizeof(floatX));
    m->dh = (floatX*)take(rows * H, sizeof(floatX));
    m->scratch_rows = rows;
    m->scratch_tokens = tokens;
    return bytes;
}

// Rows a micro-batch of B sequences of T tokens can send and receive at most: every pair kept is
// at most k per token and cap per expert and sequence; a rank's E/ep experts receive at most cap
// rows per sequence of every rank of the ep group (ep ranks x B sequences x cap x E/ep).
static inline size_t moe_max_send(const GPT2Config* c, int B, int T) {
    size_t cap = (size_t)moe_capacity(c, T);
    return (size_t)B * std::min((size_t)T * c->moe_topk, cap * c->num_experts);
}
static inline size_t moe_max_recv(const GPT2Config* c, const GPT2Place* p, int B, int T) {
    if (p->ep == 1) { return moe_max_send(c, B, T); }
    return (size_t)B * moe_capacity(c, T) * c->num_experts;
}

static inline MoE* moe_create(const GPT2Config* c, const GPT2Place* p) {
    MoE* m = new MoE();
    m->E = c->num_experts;
    m->ep = p->ep;
    m->El = c->num_experts / p->ep;
    m->k = c->moe_topk;
    m->blocks = 0;
    for (int li = 0; li < gpt2_place_num_layers(p); li++) { m->blocks += gpt2_layer_is_moe(c, gpt2_place_layer(p, li)); }
    m->micro_n = 1;
    m->step_expert.assign(m->E, 0);
    m->step_block_expert.assign((size_t)m->blocks * m->E, 0);
    m->step_dropped = m->step_pairs = 0;
    m->step_rows_remote = 0;
    m->step_aux = 0.0;
    return m;
}

// the saved routing of `slots` micro-batches of B x T tokens for every MoE block, and the scratch
static inline void moe_allocate(MoE* m, const GPT2Config* c, const GPT2Place* p, int B, int T, int slots, int H) {
    for (MoERouting& r : m->routing) { moe_routing_free(&r); }
    m->routing.assign((size_t)slots * m->blocks, MoERouting{});
    m->slots = slots;
    size_t N = (size_t)B * T, ns = moe_max_send(c, B, T), nr = moe_max_recv(c, p, B, T);
    m->bytes_saved = 0;
    for (MoERouting& r : m->routing) { m->bytes_saved += moe_routing_alloc(&r, N, B, ns, nr, m->E, m->k, c->channels, H); }
    m->bytes_scratch = moe_scratch_alloc(m, N, std::max(ns, nr), m->E, m->k, c->channels, H);
}

static inline void moe_free(MoE* m) {
    if (!m) { return; }
    for (MoERouting& r : m->routing) { moe_routing_free(&r); }
    moe_routing_free(&m->gen);
    moe_scratch_free(m);
    delete m;
}

// start of an optimizer step: the statistics count from zero
static inline void moe_step_begin(MoE* m) {
    std::fill(m->step_expert.begin(), m->step_expert.end(), 0);
    std::fill(m->step_block_expert.begin(), m->step_block_expert.end(), 0);
    m->step_dropped = m->step_pairs = 0;
    m->step_rows_remote = 0;
    m->step_aux = 0.0;
    m->step_expert_calls.clear();
}

// ---------------------------------------------------------------------------------------
// Routing, on the host: from the probabilities p (N x E) of B groups of T tokens to the chosen
// experts, the gates, which pairs are kept, the order rows are sent in (expert-major: expert
// 0's rows, then expert 1's, ...; inside an expert group by group, in priority order), the aux
// loss and its gradient. cap < 0: no capacity (generation).

static inline void moe_route(MoERouting* r, const float* p, int B, int T, int E, int k, int cap, float alpha,
                             float grad_scale, int ep, int El) {
    int N = B * T;
    r->N = N;
    r->T = T;
    r->topk.assign((size_t)N * k, 0);
    r->gates.assign((size_t)N * k, 0.0f);
    r->slot.assign((size_t)N * k, -1);
    r->aux_grad.assign((size_t)B * E, 0.0f);
    r->aux = 0.0;
    // top-k of each token: the largest p first, the lower expert on a tie
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
    // capacity, group by group; each expert's kept pairs in the order they were taken
    std::vector<std::vector<int>> rows(E);   // per expert: pair index t k + j
    std::vector<int> kept(E), chosen(E);
    for (int b = 0; b < B; b++) {
        std::fill(kept.begin(), kept.end(), 0);
        std::fill(chosen.begin(), chosen.end(), 0);
        for (int j = 0; j < k; j++) {
            for (int t = b * T; t < (b + 1) * T; t++) {
                int e = r->topk[(size_t)t * k + j];
                chosen[e]++;
                if (cap >= 0 && kept[e] >= cap) { continue; }   // over capacity: dropped
                kept[e]++;
                rows[e].push_back(t * k + j);
            }
        }
        // aux_b = alpha E sum_i f_i P_i with f_i = chosen_i / (T k), P_i = mean over the group of p_t[i]
        for (int i = 0; i < E; i++) {
            double P = 0.0;
            for (int t = b * T; t < (b + 1) * T; t++) { P += p[(size_t)t * E + i]; }
            double f = (double)chosen[i] / ((double)T * k);
            r->aux += alpha * E * f * (P / T);
            r->aux_grad[(size_t)b * E + i] = (float)(alpha * E * f / T * grad_scale);
        }
    }
    // send order: expert-major (the ranks' blocks of experts one after another)
    r->send_rows.clear();
    r->send_counts.assign((size_t)ep * El, 0);
    for (int e = 0; e < E; e++) {
        for (int pair : rows[e]) {
            r->slot[pair] = (int)r->send_rows.size();
            r->send_rows.push_back(pair / k);
        }
        r->send_counts[e] = (int)rows[e].size();   // e = dst El + local expert
    }
    r->nsend = (int)r->send_rows.size();
}

// From the counts every rank sends each of this rank's experts: the received rows' order
// (source-major: rank 0's rows for expert 0, 1, ..., then rank 1's) to expert-major (expert 0's
// rows from rank 0, 1, ..., then expert 1's): perm[i] = received row of expert-major row i, and
// its inverse; expert_rows = each local expert's first row.
static inline void moe_receive_order(MoERouting* r, int ep, int El, std::vector<int>* perm, std::vector<int>* inv) {
    std::vector<int> src_start((size_t)ep * El);   // received row where (src, e) starts
    int n = 0;
    for (int s = 0; s < ep; s++) {
        for (int e = 0; e < El; e++) { src_start[(size_t)s * El + e] = n; n += r->recv_counts[(size_t)s * El + e]; }
    }
    r->nrecv = n;
    perm->assign(n, 0);
    inv->assign(n, 0);
    r->expert_rows.assign(El + 1, 0);
    int i = 0;
    for (int e = 0; e < El; e++) {
        r->expert_rows[e] = i;
        for (int s = 0; s < ep; s++) {
            for (int q = 0; q < r->recv_counts[(size_t)s * El + e]; q++, i++) {
                (*perm)[i] = src_start[(size_t)s * El + e] + q;
                (*inv)[(*perm)[i]] = i;
            }
        }
    }
    r->expert_rows[El] = i;
}

// ---------------------------------------------------------------------------------------
// The exchange: rows to the ranks that hold their experts and back

// counts and displacements (in elements of rows of C) of an all-to-all-v from per-(peer, expert) rows
static inline void moe_peer_counts(const std::vector<int>& rows, int ep, int El, size_t C, std::vector<size_t>* cnt,
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

// rows in send order (per-peer counts `out_rows`) go to the peers, which receive `in_rows` from each
static inline void moe_exchange(MoE* m, const MoEExchange* x, const std::vector<int>& out_rows,
                                const std::vector<int>& in_rows, const floatX* send, floatX* recv, int C) {
    std::vector<size_t> sc, sd, rc, rd;
    moe_peer_counts(out_rows, x->size, m->El, (size_t)C, &sc, &sd);
    moe_peer_counts(in_rows, x->size, m->El, (size_t)C, &rc, &rd);
    for (int s = 0; s < x->size; s++) { if (s != x->rank) { m->step_rows_remote += sc[s] / C; } }
    x->rows(x->ctx, send, sc.data(), sd.data(), recv, rc.data(), rd.data());
}

// ---------------------------------------------------------------------------------------
// The forward and backward of an MoE block's MLP (the mlp op's body for MoE blocks)

// which of the rank's MoE blocks global layer l is
static inline int moe_block_index(const GPT2* model, int l) {
    int local = gpt2_place_local(&model->place, l), n = 0;
    for (int li = 0; li < local; li++) { n += gpt2_layer_is_moe(&model->config, gpt2_place_layer(&model->place, li)); }
    return n;
}

static inline MoERouting* moe_routing_at(GPT2* model, const OpAt* at, int H) {
    MoE* m = model->moe;
    if (at->slot >= 0) {
        MoERouting* r = &m->routing[(size_t)at->slot * m->blocks + moe_block_index(model, at->layer)];
        if ((size_t)at->B * at->T > r->cap_tokens) { die("MoE block %d: %d x %d tokens exceed its buffers", at->layer, at->B, at->T); }
        return r;
    }
    // generation: every pair kept, N k rows; grow the buffers when a call has more tokens
    size_t N = (size_t)at->B * at->T, rows = N * m->k;
    if (m->ep != 1) { die("generation with expert parallelism is not built: each rank holds %d of the %d experts", m->El, m->E); }
    if (N > m->gen.cap_tokens) {
        moe_routing_free(&m->gen);
        moe_routing_alloc(&m->gen, N, at->B, rows, rows, m->E, m->k, model->config.channels, H);
    }
    if (N > m->scratch_tokens || rows > m->scratch_rows) {
        m->bytes_scratch = moe_scratch_alloc(m, std::max(N, m->scratch_tokens), std::max(rows, m->scratch_rows), m->E, m->k,
                                             model->config.channels, H);
    }
    return &m->gen;
}

// out (B T, C) = the MoE MLP of x (B T, C). x is ln2's output, w the block's weights.
static inline void moe_forward(GPT2* model, const OpAt* at, floatX* out, const floatX* x, const BlockWeights* w, int C,
                               int H, const MoEExchange* xch) {
    MoE* m = model->moe;
    const GPT2Config* c = &model->config;
    const GPT2Ops* ops = &model->ops;
    int B = at->B, T = at->T, N = B * T, E = m->E, k = m->k, El = m->El;
    MoERouting* r = moe_routing_at(model, at, H);
    // router: logits, probabilities on the device; decisions on the host
    matmul_forward(m->logits, x, w->routerw, NULL, B, T, C, E);
    moe_softmax(r->probs, m->logits, N, E);
    std::vector<float> p((size_t)N * E);
    copy_device_to_host(p.data(), r->probs, p.size() * sizeof(float));
    int training = at->slot >= 0;
    // the mean over the step's groups, times the loss scale the rest of the backward carries (llmc/train/loss_scale.h)
    float grad_scale = model->loss_scale / ((float)B * m->micro_n);
    moe_route(r, p.data(), B, T, E, k, training ? moe_capacity(c, T) : -1, c->moe_aux, grad_scale, m->ep, El);
    copy_host_to_device(r->topk_d, r->topk.data(), r->topk.size() * sizeof(int));
    copy_host_to_device(r->gates_d, r->gates.data(), r->gates.size() * sizeof(float));
    copy_host_to_device(r->slot_d, r->slot.data(), r->slot.size() * sizeof(int));
    copy_host_to_device(r->send_rows_d, r->send_rows.data(), r->send_rows.size() * sizeof(int));
    copy_host_to_device(r->aux_grad_d, r->aux_grad.data(), r->aux_grad.size() * sizeof(float));
    if (training) {   // statistics of the step
        long* block = &m->step_block_expert[(size_t)moe_block_index(model, at->layer) * E];
        for (int pair = 0; pair < N * k; pair++) {
            if (r->slot[pair] >= 0) { m->step_expert[r->topk[pair]]++; block[r->topk[pair]]++; } else { m->step_dropped++; }
        }
        m->step_pairs += (long)N * k;
        m->step_aux += r->aux / B;
    }
    // dispatch: the kept pairs' token rows, expert-major; to the experts' ranks
    std::vector<int> perm, inv;
    if (xch->ctx == NULL) {   // one rank holds every expert: the send order is the experts' order
        r->recv_counts = r->send_counts;
        moe_receive_order(r, 1, El, &perm, &inv);
        moe_gather_rows(r->xin, x, r->send_rows_d, r->nsend, C);
    } else {
        moe_gather_rows(m->send, x, r->send_rows_d, r->nsend, C);
        r->recv_counts.assign((size_t)xch->size * El, 0);
        xch->counts(xch->ctx, r->send_counts.data(), r->recv_counts.data(), El);
        moe_receive_order(r, xch->size, El, &perm, &inv);
        if ((size_t)r->nrecv > r->cap_recv) { die("MoE block %d: %d rows received, the buffers hold %zu", at->layer, r->nrecv, r->cap_recv); }
        copy_host_to_device(r->perm_d, perm.data(), perm.size() * sizeof(int));
        copy_host_to_device(r->inv_d, inv.data(), inv.size() * sizeof(int));
        moe_exchange(m, xch, r->send_counts, r->recv_counts, m->send, m->recv, C);
        moe_gather_rows(r->xin, m->recv, r->perm_d, r->nrecv, C);   // source-major -> expert-major
    }
    // the experts, each on its rows
    floatX* y = xch->ctx == NULL ? r->yret : m->buf;
    for (int e = 0; e < El; e++) {
        int o = r->expert_rows[e], n = r->expert_rows[e + 1] - o;
        if (n == 0) { continue; }
        if (training) { m->step_expert_calls.push_back(n); }
        OpAt ate = *at;
        ate.B = 1;
        ate.T = ate.Ts = n;
        ops->linear.forward(ops->linear.ctx, &ate, LINEAR_FC, r->fch + (size_t)o * H, r->xin + (size_t)o * C,
                            w->expfcw + (size_t)e * H * C, w->expfcb + (size_t)e * H, C, H);
        gelu_forward(r->fch_gelu + (size_t)o * H, r->fch + (size_t)o * H, (size_t)n * H);
        ops->linear.forward(ops->linear.ctx, &ate, LINEAR_FCPROJ, y + (size_t)o * C, r->fch_gelu + (size_t)o * H,
                            w->expfcprojw + (size_t)e * C * H, w->expfcprojb + (size_t)e * C, H, C);
    }
    if (xch->ctx != NULL) {   // back home: expert-major -> source-major, then the reverse exchange
        moe_gather_rows(m->recv, m->buf, r->inv_d, r->nrecv, C);
        moe_exchange(m, xch, r->recv_counts, r->send_counts, m->recv, r->yret, C);
    }
    // combine: out[t] = sum over t's kept pairs of gate x expert output
    moe_combine(out, r->yret, r->slot_d, r->gates_d, N, k, C, 0);
}

// dinp (B T, C) = the gradient of x (overwritten); the expert and router weight gradients in g
// accumulate. dout: the gradient of the block's MLP output.
static inline void moe_backward(GPT2* model, const OpAt* at, floatX* dinp, const floatX* dout, const floatX* x,
                                const BlockWeights* w, BlockWeights* g, int C, int H, const MoEExchange* xch) {
    MoE* m = model->moe;
    const GPT2Ops* ops = &model->ops;
    int B = at->B, T = at->T, N = B * T, E = m->E, k = m->k, El = m->El;
    MoERouting* r = moe_routing_at(model, at, H);
    // combine's backward: each kept pair's output gradient g dout[t] (send order), the gates' gradient
    moe_combine_backward(m->send, m->dgate, dout, r->yret, r->slot_d, r->gates_d, N, k, C);
    floatX* dy = m->send;            // expert-major gradient of the experts' outputs
    if (xch->ctx != NULL) {
        moe_exchange(m, xch, r->send_counts, r->recv_counts, m->send, m->recv, C);
        moe_gather_rows(m->buf, m->recv, r->perm_d, r->nrecv, C);
        dy = m->buf;
    }
    floatX* dx = xch->ctx == NULL ? m->buf : m->send;   // the experts' input gradient, expert-major
    for (int e = 0; e < El; e++) {
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
    floatX* dx_home = dx;            // in send order
    if (xch->ctx != NULL) {
        moe_gather_rows(m->recv, dx, r->inv_d, r->nrecv, C);
        moe_exchange(m, xch, r->recv_counts, r->send_counts, m->recv, m->buf, C);
        dx_home = m->buf;
    }
    // router: the gates' and the aux loss's gradient through the softmax, then the router matmul
    moe_router_backward(m->logits, r->probs, r->topk_d, m->dgate, r->aux_grad_d, N, E, k, T);
    matmul_backward(dinp, g->routerw, NULL, m->logits, x, w->routerw, B, T, C, E);
    // and every kept pair's input gradient back to its token
    moe_combine(dinp, dx_home, r->slot_d, NULL, N, k, C, 1);
}

// the aux loss of the last forward on a slot: the sum over MoE blocks of the mean over groups
static inline float moe_aux_loss(const MoE* m, int slot, int B) {
    double sum = 0.0;
    for (int b = 0; b < m->blocks; b++) { sum += m->routing[(size_t)slot * m->blocks + b].aux; }
    return (float)(sum / B);
}
static inline size_t moe_dropped(const MoE* m, int slot) {
    size_t n = 0;
    for (int b = 0; b < m->blocks; b++) {
        const MoERouting* r = &m->routing[(size_t)slot * m->blocks + b];
        for (int s : r->slot) { n += s < 0; }
    }
    return n;
}

// ---------------------------------------------------------------------------------------
// What the trainer prints
// (the per-step line, which sums over the data-parallel ranks, is moe_report_step in
// llmc/parallel/ep.h, beside the MPI calls it needs)

static inline void moe_print_plan(const GPT2* model) {
    const GPT2Config* c = &model->config;
    const MoE* m = model->moe;
    printf("moe          %d experts, top-%d%s, in 1 of every %d blocks (blocks", c->num_experts, c->moe_topk,
           c->moe_topk == 1 ? " (Switch: gate = p)" : " (gates renormalised)", c->moe_every);
    for (int l = 0; l < c->num_layers; l++) { if (gpt2_layer_is_moe(c, l)) { printf(" %d", l); } }
    int T = model->max_T;
    printf("), capacity factor %g: %d of a sequence's %d x %d pairs per expert, aux coefficient %g\n", c->moe_capacity,
           moe_capacity(c, T), T, c->moe_topk, c->moe_aux);
    size_t total = model->num_parameters_full;
    size_t idle = (size_t)gpt2_moe_layers(c) * (c->num_experts - c->moe_topk) * moe_expert_params(c, 1);
    printf("moe params   %zu in all, %zu active per token (dense + router + %d of %d experts per MoE block); routing state "
           "%.3f MiB saved, %.3f MiB scratch on this rank\n", total, total - idle, c->moe_topk, c->num_experts,
           m->bytes_saved / 1048576.0, m->bytes_scratch / 1048576.0);
}
