// The routing of an MoE block (llmc/model/moe_block.h) after the top-k: which (token, choice) pairs the
// capacity keeps, Switch's load-balancing loss and its gradient, the order the kept rows are sent
// in, and the decisions' copies to the device. What one block decided for one micro-batch is a
// MoERouting, saved for the backward.
//
//   capacity   a routing group is one sequence of T tokens: an expert takes at most
//              cap = ceil(factor T k / E) of its pairs, first choices of every token first
//              (j = 1 for t = 0..T-1, then j = 2, ...); a pair over capacity is DROPPED
//   aux loss   per group: f_i = share of the T k pairs sent to expert i (before dropping),
//              P_i = mean of p_t[i]; aux = alpha E sum_i f_i P_i, and d aux / d p_t[i] = alpha E f_i / T
//   send order expert-major: expert 0's kept rows, then expert 1's, ... (the ranks' blocks of
//              experts one after another); inside an expert group by group, in priority order
#pragma once

#include <math.h>
#include <vector>
#include "../common.h"
#include "../backend.h"
#include "params.h"

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

static inline int moe_capacity(const GPT2Config* c, int T) {
    double cap = ceil((double)c->moe_capacity * T * c->moe_topk / c->num_experts);
    return cap < T ? (int)cap : T;   // an expert never gets more than the T tokens of a sequence (a huge factor: T)
}

// From the chosen experts r->topk of B groups of T tokens and the probabilities p (N x E): which
// pairs are kept, the aux loss and its gradient (times grad_scale), the send order and the rows
// per (rank, local expert). cap < 0: no capacity (generation).
static inline void moe_route_keep(MoERouting* r, const float* p, int B, int T, int E, int k, int cap, float alpha,
                                  float grad_scale, int ep, int El) {
    r->slot.assign((size_t)B * T * k, -1);
    r->aux_grad.assign((size_t)B * E, 0.0f);
    r->aux = 0.0;
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

// the host's decisions, to the device (the kernels read them)
static inline void moe_routing_upload(MoERouting* r) {
    copy_host_to_device(r->topk_d, r->topk.data(), r->topk.size() * sizeof(int));
    copy_host_to_device(r->gates_d, r->gates.data(), r->gates.size() * sizeof(float));
    copy_host_to_device(r->slot_d, r->slot.data(), r->slot.size() * sizeof(int));
    copy_host_to_device(r->send_rows_d, r->send_rows.data(), r->send_rows.size() * sizeof(int));
    copy_host_to_device(r->aux_grad_d, r->aux_grad.data(), r->aux_grad.size() * sizeof(float));
}
