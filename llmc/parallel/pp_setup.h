// Setting up a pipeline stage and handing it to the plan (llmc/plan/parallel_plan.h): which layers each
// stage holds (pp_stage_place, checked by pp_check_layers); the schedule built and checked, the
// activation slots for its peak in flight, the embedding group (pp_init); the step and the
// evaluation's forward through the stages (pp_step); what the update asks of the pipeline
// (pp_shard_group). The executor itself is pp.h.
#pragma once

#include <string>
#include "pp.h"
#include "pp_schedule.h"
#include "pp_validate.h"
#include "pp_split_backward.h"

// ---- where each stage's layers are

// Every rank computes every stage's, so rank 0 can print them. split: layers per stage (v = 1),
// or NULL for the even split (the first L % p stages one more).
static inline void pp_stage_place(GPT2Place* place, int L, int p, int v, const int* split, int s) {
    if (v > 1) {   // interleaved: chunk c of stage s is global chunk c p + s
        int lc = L / (v * p);
        place->layer_begin = s * lc;
        place->layer_end = s * lc + lc;
        place->chunks = v;
        place->chunk_stride = p * lc;
    } else {
        int begin = 0;
        for (int t = 0; t < s; t++) { begin += split ? split[t] : L / p + (t < L % p); }
        place->layer_begin = begin;
        place->layer_end = begin + (split ? split[s] : L / p + (s < L % p));
        place->chunks = 1;
        place->chunk_stride = 0;
    }
    place->has_embedding = s == 0;
    place->has_head = s == p - 1;
}

// Every rank checks the same things, so every rank reports a mesh that does not fit the model.
static inline void pp_check_layers(int L, int p, int v, const int* split, int nsplit) {
    if (p > L) { die("--pp %d: more pipeline stages than the model's %d layers (each stage needs a layer)", p, L); }
    if (v > 1 && L % (v * p) != 0) {
        die("--pp %d --pp-chunks %d: %d x %d = %d interleaved chunks do not divide the model's %d layers", p, v, v, p, v * p, L);
    }
    if (split) {
        if (v > 1) { die("--pp-split gives each stage's layers; interleaved chunks (--pp-chunks %d) need the even split", v); }
        if (nsplit != p) { die("--pp-split lists %d stages, but --pp is %d", nsplit, p); }
        int sum = 0;
        for (int s = 0; s < p; s++) {
            if (split[s] < 1) { die("--pp-split: stage %d gets %d layers (each stage needs at least one)", s, split[s]); }
            sum += split[s];
        }
        if (sum != L) { die("--pp-split adds up to %d layers, but the model has %d", sum, L); }
    }
}

// ---- the step and the evaluation

// Evaluation: one batch forward through the stages in order (no pipelining), the loss sum on
// every rank.
static inline double pp_forward_loss(void* ctx, GPT2* model, const MicroBatch* mb) {
    PipelineParallel* pp = (PipelineParallel*)ctx;
    (void)model;
    double loss = 0.0;
    size_t n = pp_stream_count(pp, mb);
    CommType t = COMM_FLOATX;
    for (int g = 0; g <= pp_last_chunk(pp); g++) {
        if (g % pp->p != pp->stage) { continue; }
        PPAction a = {PP_F, 0, g / pp->p, -1};
        int slot = pp_slot(pp, 0, a.chunk, mb);
        if (g > 0) { comm_recv(pp->comm, pp->model->acts[slot].encoded, n, t, (g - 1) % pp->p); }
        loss += pp_forward(pp, &a, mb, 0.0f, 0);
        if (g < pp_last_chunk(pp)) { comm_send(pp->comm, gpt2_stage_output(pp->model, slot), n, t, (g + 1) % pp->p); }
        pp_free_slot(pp, 0, a.chunk);
    }
    MPI_Bcast(&loss, 1, MPI_DOUBLE, pp->p - 1, pp->comm->mpi);
    return loss;
}

static inline GPT2Step pp_step(PipelineParallel* pp) {
    GPT2Step s = {pp_schedule_name(pp->kind), pp, pp_step_run, pp_forward_loss};
    return s;
}

// ---- what the update asks of the pipeline

static inline ShardGroup pp_shard_group(PipelineParallel* pp) { return ShardGroup{pp, pp_complete_grads, pp_sum_norm}; }

// ---- setting up

// Collective over the pp group: the schedule, checked; the activation slots for its peak in
// flight (the model's activations are allocated again); the embedding group.
static inline void pp_init(PipelineParallel* pp, GPT2* model, Comm* comm, int kind, int v, int m, int use_ring,
                           ShardGroup inner) {
    pp->comm = comm;
    pp->p = comm->size;
    pp->stage = comm->rank;
    pp->v = v;
    pp->m = m;
    pp->kind = kind;
    pp->use_ring = use_ring;
    pp->model = model;
    pp->inner = inner;
    pp->dp = NULL;
    pp->root_done = NULL;
    std::string err = pp_schedule_check(kind, pp->p, m, v);
    if (!err.empty()) { die("--pp-schedule %s: %s", pp_schedule_name(kind), err.c_str()); }
    pp->schedule = pp_build(kind, pp->p, m, v);
    err = pp_validate(pp->schedule);
    if (!err.empty()) { die("pipeline schedule %s (p %d, m %d, v %d) is invalid: %s", pp_schedule_name(kind), pp->p, m, v, err.c_str()); }
    int slots = pp_peak_inflight(pp->schedule)[pp->stage];
    gpt2_allocate_activations_slots(model, pp->model->max_B, pp->model->max_T, slots);
    pp->slot_of.assign((size_t)m * v, -1);
    pp->free_slots.clear();
    for (int s = slots - 1; s >= 0; s--) { pp->free_slots.push_back(s); }
    pp->in_flight = pp->peak_in_flight = 0;
    pp->grad_recv_owner = pp->dres_owner = -1;
    pp->passes.assign(v, 0);
    size_t stream = (size_t)model->max_B * gpt2_place_stream_tokens(&model->place, model->max_T) * model->config.channels;
    pp->grad_recv = (floatX*)device_malloc(stream * sizeof(floatX));
    pp->buffer_bytes = stream * sizeof(floatX);
    pp->backward = pp_backward;   // B the whole backward, no W; ZB-H1 runs the two halves instead
    pp->weight = NULL;
    pp->keep = NULL;
    pp->keep_per_layer = 0;
    if (pp->schedule.split_backward) { pp_split_backward_init(pp, slots); }
    int member = pp->stage == 0 || pp->stage == pp->p - 1;
    pp->embed = comm_split(comm, member ? 0 : 1 + pp->stage, pp->stage, "pp-embedding");
#ifdef LLMC_CUDA_COMM
    if (comm->device) { comm_enable_device(&pp->embed, 0, 0); }   // dwte is a device buffer
#endif
}

static inline void pp_free(PipelineParallel* pp) {
    device_free(pp->grad_recv);
    if (pp->keep) { device_free(pp->keep); }
    comm_free(&pp->embed);
}

