// The memory of the MoE blocks (llmc/model/moe_block.h): a routing state (MoERouting) per micro-batch
// slot and MoE block, saved for the backward and sized by the capacity; generation's, grown on
// demand; the scratch the blocks share; the step's statistics (llmc/model/moe_stats.h).
// Included by llmc/model/moe_block.h (it needs GPT2).
//
// Memory per block and slot: p (N E fp32), the expert inputs and hidden units of at most
// B cap E rows (the capacity bound), the k N gates, slots and expert outputs.
#pragma once

#include <vector>
#include "../common.h"
#include "../backend.h"
#include "params.h"
#include "gpt2_core.h"   // GPT2, GPT2Place
#include "ops.h"
#include "moe_routing.h"

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
    uint64_t step_rows_remote;       // rows sent to other ep ranks (all four exchanges)
    double step_aux;                 // sum of the blocks' aux over the step's forwards
    std::vector<int> step_expert_calls;   // rows of each expert call of the step's forwards (tensor
                                     // parallelism's all-reduces inside the experts follow them)
} MoE;

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

// which of the rank's MoE blocks global layer l is
static inline int moe_block_index(const GPT2* model, int l) {
    int local = gpt2_place_local(&model->place, l), n = 0;
    for (int li = 0; li < local; li++) { n += gpt2_layer_is_moe(&model->config, gpt2_place_layer(&model->place, li)); }
    return n;
}

// the routing state of the pass at `at`: its slot's for training, generation's (slot -1) otherwise
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
