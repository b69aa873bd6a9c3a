// What expert parallelism (llmc/parallel/ep.h) costs, by formula, and what the trainer prints
// beside what it counted: the expert parameters and state per rank, the all-to-all and edp
// bytes of a step, and the MoE blocks' load per step summed over the data-parallel ranks.
// The planner (llmc/planner/cost_model.h) predicts with the same formulas. Included at the end of ep.h.
#pragma once

#include <algorithm>
#include <vector>
#include "ep_core.h"   // ExpertParallel, GPT2Config, GPT2Place

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
// (2 a C x the rows sent to other ranks in the four exchanges, MoE.step_rows_remote)
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
