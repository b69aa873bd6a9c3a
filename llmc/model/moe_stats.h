// What the MoE blocks (llmc/model/moe_block.h) count and print: the step's kept pairs per expert (and
// per block), the drops, the aux loss, the rows of each expert call, and the plan printed at
// start. The per-step line, which sums over the data-parallel ranks, is moe_report_step in
// llmc/parallel/ep_accounting.h, beside the MPI calls it needs.
// Included by llmc/model/moe_block.h (it needs GPT2).
#pragma once

#include <vector>
#include "../common.h"
#include "params.h"
#include "moe_buffers.h"

// start of an optimizer step: the statistics count from zero
static inline void moe_step_begin(MoE* m) {
    std::fill(m->step_expert.begin(), m->step_expert.end(), 0);
    std::fill(m->step_block_expert.begin(), m->step_block_expert.end(), 0);
    m->step_dropped = m->step_pairs = 0;
    m->step_rows_remote = 0;
    m->step_aux = 0.0;
    m->step_expert_calls.clear();
}

// a training forward's routing of B groups in MoE block `layer`: kept pairs per expert, drops, aux
static inline void moe_count_routing(GPT2* model, int layer, const MoERouting* r, int B) {
    MoE* m = model->moe;
    int pairs = r->N * m->k;
    long* block = &m->step_block_expert[(size_t)moe_block_index(model, layer) * m->E];
    for (int pair = 0; pair < pairs; pair++) {
        if (r->slot[pair] >= 0) { m->step_expert[r->topk[pair]]++; block[r->topk[pair]]++; } else { m->step_dropped++; }
    }
    m->step_pairs += (long)pairs;
    m->step_aux += r->aux / B;
}

// a training forward's expert calls: the rows of each (tensor parallelism's formula follows them)
static inline void moe_count_expert_calls(MoE* m, const MoERouting* r) {
    for (int e = 0; e < m->El; e++) {
        int n = r->expert_rows[e + 1] - r->expert_rows[e];
        if (n > 0) { m->step_expert_calls.push_back(n); }
    }
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
