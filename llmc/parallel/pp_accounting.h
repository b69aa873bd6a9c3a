// The accounting of a pipeline stage (pp.h): what the formulas predict, and what the trainer
// prints. The bytes each stage sends per step (pp.h's cost) and the embedding group's, checked
// against what the communicators counted every step, with the peak of micro-batches in flight
// against the schedule's; the plan's lines (each stage's layers, slots and activations, the
// bubble simulated and by formula, the timeline with --pp-print); the memory lines, checked
// against tp_accounting.h's closed forms; and every step's bubble, measured on the stages' clocks beside
// the one simulated with the measured F/B/W times (pp_simulate.h) and the formula.
#pragma once

#include <vector>
#include "tp_accounting.h"
#include "pp.h"
#include "pp_setup.h"
#include "pp_timeline.h"

// bytes this stage sends in one step (pp.h's cost)
static inline uint64_t pp_formula_bytes(const PipelineParallel* pp, int B, int T) {
    uint64_t a = sizeof(floatX), X = (uint64_t)B * gpt2_place_stream_tokens(&pp->model->place, T) * pp->model->config.channels;
    uint64_t fwd = (uint64_t)pp->v - (pp->stage == pp->p - 1), bwd = (uint64_t)pp->v - (pp->stage == 0);
    return (uint64_t)pp->m * (fwd + bwd) * X * a;
}
static inline uint64_t pp_formula_embed_bytes(const PipelineParallel* pp) {
    if (pp->p == 1 || (pp->stage != 0 && pp->stage != pp->p - 1)) { return 0; }
    return allreduce_ring_volume(pp->model->param_info[0].numel, COMM_FLOATX, 2, pp->stage == 0 ? 0 : 1).bytes;
}

// Collective over the pp group (each stage's activation bytes come to every rank; rank 0 prints).
static inline void pp_print_plan(const PipelineParallel* pp, const GPT2Config* cfg, const int* split, int print_timeline) {
    std::vector<double> acts(pp->p);
    double mine = (double)pp->model->acts_requested;
    MPI_Allgather(&mine, 1, MPI_DOUBLE, acts.data(), 1, MPI_DOUBLE, pp->comm->mpi);
    printf("pipeline     pp %d, schedule %s", pp->p, pp_schedule_name(pp->kind));
    if (pp->v > 1) { printf(" with %d chunks per stage", pp->v); }
    printf(", %d micro-batches per step (= --grad-accum)\n", pp->m);
    std::vector<int> peak = pp_peak_inflight(pp->schedule);
    for (int s = 0; s < pp->p; s++) {
        GPT2Place pl = gpt2_place_whole(cfg);
        pp_stage_place(&pl, cfg->num_layers, pp->p, pp->v, split, s);
        printf("  stage %d    layers", s);
        for (int c = 0; c < pl.chunks; c++) {
            printf("%s %d-%d", c ? "," : "", pl.layer_begin + c * pl.chunk_stride, pl.layer_end + c * pl.chunk_stride - 1);
        }
        printf("%s%s | %d activation slots (the schedule's peak in flight), activations %.3f MiB\n",
               pl.has_embedding ? " + embedding" : "", pl.has_head ? " + lnf, LM head, loss" : "", peak[s], acts[s] / 1048576.0);
    }
    PPCosts eq = {1.0, 1.0, 1.0, 0.0};
    PPSim sim = pp_simulate(pp->schedule, eq);   // what --pp-print draws
    printf("  bubble     %.3f simulated with F = B = W, formula %.3f; tied wte summed over stages 0 and %d\n", sim.bubble,
           pp_formula_bubble(pp->kind, pp->p, pp->m, pp->v, eq), pp->p - 1);
    if (print_timeline) {
        printf("pipeline schedule (--pp-print), F = B = W = 1 time unit:\n");
        pp_print_timeline(stdout, pp->schedule, sim);
        pp_print_lists(stdout, pp->schedule);
    }
}

// The memory lines of this stage (rank 0's: stage 0), and the check on every rank that the
// parameters and the activation slots allocated equal the closed forms (tp_accounting.h's, which count a
// stage's layers and ends and a slot's chunk). Collective over the pp group.
static inline int pp_print_memory(const PipelineParallel* pp) {
    const GPT2* m = pp->model;
    size_t psi = tp_formula_params(m), acts = tp_formula_activations(m, m->max_B, m->max_T, m->num_slots);
    int ok = psi == m->num_parameters && acts == m->acts_requested, all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, pp->comm->mpi);
    printf("pipeline stage %d of %d: Psi %zu of %zu (formula %zu), activations %.3f MiB in %d slots (formula %.3f MiB)\n",
           pp->stage, pp->p, m->num_parameters, m->num_parameters_full, psi, m->acts_requested / 1048576.0, m->num_slots,
           acts / 1048576.0);
    printf("  pp buffers %9.3f MiB  (a received gradient B Ts C%s)\n", pp->buffer_bytes / 1048576.0,
           pp->schedule.split_backward ? ", ZB-H1's kept output gradients per slot and layer" : "");
    printf("pp memory check %s (measured %s formula on all %d stages)\n", all_ok ? "ok" : "FAILED", all_ok ? "=" : "!=", pp->p);
    return all_ok;
}

// After each step: bytes against the formula, the peak in flight against the schedule's, and the
// bubble measured against the one simulated with the measured F/B/W times and the formula.
// Collective over the pp group (every rank calls it; rank 0 prints).
static inline void pp_report_step(PipelineParallel* pp, int B, int T) {
    uint64_t sent = pp->comm->bytes_sent - pp->bytes_start, want = pp_formula_bytes(pp, B, T);
    uint64_t esent = pp->embed.bytes_sent - pp->embed_bytes_start, ewant = pp_formula_embed_bytes(pp);
    int peak_want = pp_peak_inflight(pp->schedule)[pp->stage];
    // per stage: wall time of the schedule, busy time; mean action times over the stages
    const PPMeasure* t = &pp->measured;
    double span = t->t_end - t->t_start, local[8] = {t->busy, t->act_seconds[0], t->act_seconds[1], t->act_seconds[2],
                                                     (double)t->act_count[0], (double)t->act_count[1],
                                                     (double)t->act_count[2], 0.0};
    double sums[8], max_span = span;
    MPI_Allreduce(local, sums, 8, MPI_DOUBLE, MPI_SUM, pp->comm->mpi);
    MPI_Allreduce(MPI_IN_PLACE, &max_span, 1, MPI_DOUBLE, MPI_MAX, pp->comm->mpi);
    int ok = sent == want && esent == ewant && pp->peak_in_flight == peak_want, all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, pp->comm->mpi);
    double measured = max_span > 0 ? 1.0 - sums[0] / (pp->p * max_span) : 0.0;
    PPCosts c = {sums[4] > 0 ? sums[1] / sums[4] : 0.0, sums[5] > 0 ? sums[2] / sums[5] : 0.0, sums[6] > 0 ? sums[3] / sums[6] : 0.0, 0.0};
    if (!pp->schedule.split_backward) { c.w = 0.0; }   // B is the whole backward: its measured time already holds W
    PPSim sim = pp_simulate(pp->schedule, c);
    printf("  pp comm | sent %9.3f MiB (formula %9.3f MiB, %s) + embedding group %.3f MiB (formula %.3f) | "
           "in flight %d (schedule %d) | %.1f ms | check %s\n",
           sent / 1048576.0, want / 1048576.0, sent == want ? "equal" : "DIFFERENT", esent / 1048576.0, ewant / 1048576.0,
           pp->peak_in_flight, peak_want, t->comm_seconds * 1e3, all_ok ? "ok" : "FAILED");
    printf("  pp bubble | measured %.3f | simulated %.3f with the measured F %.2f, B %.2f, W %.2f ms | formula %.3f\n", measured,
           sim.bubble, c.f * 1e3, c.b * 1e3, c.w * 1e3, pp_formula_bubble(pp->kind, pp->p, pp->m, pp->v, c));
}
