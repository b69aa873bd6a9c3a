// Pipeline parallelism: the layers split over the p ranks of the mesh's pp group (stages), the
// micro-batches of a step flowing through them as a schedule says (llmc/parallel/pp_schedule.h:
// GPipe, 1F1B, interleaved 1F1B, ZB-H1). This file is the EXECUTOR: it runs any schedule's
// action list, as the plan's step (llmc/train/step.h), on the model's pieces (llmc/model/gpt2.h).
//
//   stage 0          stage 1          stage 2          stage 3
//   [emb|blk 0-1] -> [blk 2-3]     -> [blk 4-5]     -> [blk 6-7|lnf|head|loss]    activations
//                 <-               <-               <-                            gradients
//   wte (lookup) ............ embedding group: dwte summed ............ wte (LM head)
//
// Stages and chunks (GPT2Place, llmc/model/params.h): stage s holds layers [begin, end) and, with v
// interleaved chunks, v of them: global chunk g = c p + s, c < v, of L / (v p) layers each.
// The first stage has the embedding, the last the final layernorm, the LM head and the loss.
// Between neighbours travel one micro-batch's activations (forward) or their gradients
// (backward): B_micro x Ts x C values (Ts = T, or T/tp with sequence parallelism).
//
// The executor, action by action (PPAction):
//   F(i, c)       forward of micro-batch i on local chunk c into an activation slot; on the
//                 last global chunk also the head and the loss, which writes dlogits
//   B(i, c)       backward (ZB-H1: the input half only, gpt2_block_backward_input); the slot's
//                 activations are freed here, or at W with ZB-H1
//   W(i, c)       ZB-H1: the weight half (gpt2_block_backward_weight), from what B kept
//   send / recv   a run of consecutive sends and receives is one exchange (comm_exchange:
//                 MPI_Isend/Irecv + Waitall, or ncclSend/ncclRecv in one group): it returns when
//                 all its messages are through. The schedule validator proved (pp_validate) that every
//                 exchange finds its partners even when a send waits for its receive (NCCL,
//                 or MPI above the eager limit), so no ordering of ranks can deadlock.
// Activation memory: a slot per (micro-batch, chunk) in flight, so the schedule's peak in
// flight (GPipe m, 1F1B p - s on stage s) is what the stage allocates.
//
// The tied embedding: wte lives on the first stage (the lookup) and the last (the LM head), as
// in Megatron. Each accumulates its own part of dwte; after the last backward the two sum them
// over the embedding group (an all-reduce of Vp C / tp values between stages 0 and p-1), so both
// copies get the same gradient and the same AdamW update, and stay identical.
//
// Cost per step, per stage (bytes sent, a = bytes per value, Ts tokens of the stream):
//   activations   m (v - [s = p-1]) B Ts C a      gradients   m (v - [s = 0]) B Ts C a
//   embedding     2 (2-1)/2 Vp C/tp a  (an all-reduce between two ranks; first and last stage)
// Bubble (the lecture "LLM Pre-training and Beyond", after Narayanan et al. 2021): each stage
// idles t_pb = (p-1)(t_f + t_b) for GPipe and 1F1B. The lecture divides it by the ideal step
// m (t_f + t_b): (p-1)/m, and (1/v)(p-1)/m interleaved. This code divides it by the whole step,
// t_pb + m (t_f + t_b): (p-1)/(m+p-1), and (p-1)/(v m + p-1) interleaved; that is the fraction
// it prints (pp_schedule.h derives them, and ZB-H1's).
#pragma once

#include <vector>
#include "../model/gpt2.h"
#include "../train/step.h"
#include "../train/trace.h"
#include "../comm/native.h"
#include "../comm/ring.h"
#include "dp_core.h"
#include "tp_accounting.h"
#include "pp_schedule.h"

typedef struct PipelineParallel {
    Comm* comm;              // the pp group: the stages of this replica (mesh.dim[MESH_PP])
    Comm embed;              // the embedding group: stages 0 and p-1 (a group of one elsewhere)
    int p, stage, v, m, kind;
    int use_ring;            // 1: our ring all-reduce for the embedding group (bytes counted)
    PPSchedule sched;
    PPSim sim_equal;         // the schedule simulated with F = B = W = 1 (what --pp-print draws)
    GPT2* model;
    int B, T;                // the micro-batch shape the buffers are sized for
    // activation slots: one per (micro-batch, chunk) in flight
    std::vector<int> slot_of;      // [micro * v + chunk] -> slot, or -1
    std::vector<int> free_slots;
    int in_flight, peak_in_flight;
    std::vector<int> passes;       // [chunk] backward passes of the chunk done this step
    floatX* grad_recv;             // (B, Ts, C) a received activation gradient
    int grad_recv_owner, dres_owner;   // whose gradient grad_recv / dresidual hold (micro v + chunk), or -1
    floatX* keep;                  // ZB-H1: per slot and layer, what W needs (gpt2.h's BlockGradKeep)
    size_t keep_per_layer;         // floatX per layer of a slot
    size_t buffer_bytes;           // grad_recv + keep
    // what the update needs from the rest of the plan
    ShardGroup inner;              // the tp group's (or none)
    void* dp;                      // the data-parallel layer: told when the tied wte's gradient is whole
    void (*root_done)(void* dp);
    // measurements of the current step
    uint64_t bytes_start, embed_bytes_start;
    double t_start, t_end, busy;   // wall time of the schedule on this stage, time in F/B/W
    double act_seconds[3];         // F, B, W: time and count this step
    int act_count[3];
    double comm_seconds;
    float loss;
} PipelineParallel;

// ---------------------------------------------------------------------------------------
// Where each stage's layers are (every rank computes every stage's, so rank 0 can print them).
// split: layers per stage (v = 1), or NULL for the even split (the first L % p stages one more).

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

// ---------------------------------------------------------------------------------------
// Slots

// (micro-batch, chunk) as one number: the index of slot_of, and what the buffer owners hold
static inline int pp_id(const PipelineParallel* pp, int micro, int chunk) { return micro * pp->v + chunk; }

static inline int pp_slot(PipelineParallel* pp, int micro, int chunk, const MicroBatch* mb) {
    int* s = &pp->slot_of[pp_id(pp, micro, chunk)];
    if (*s >= 0) { return *s; }
    if (pp->free_slots.empty()) { die("pipeline stage %d: more micro-batches in flight than the schedule said", pp->stage); }
    *s = pp->free_slots.back();
    pp->free_slots.pop_back();
    gpt2_set_batch(pp->model, *s, NULL, mb->B, mb->T);
    pp->model->acts[*s].chunk = chunk;
    pp->in_flight++;
    pp->peak_in_flight = std::max(pp->peak_in_flight, pp->in_flight);
    return *s;
}
static inline void pp_free_slot(PipelineParallel* pp, int micro, int chunk) {
    int* s = &pp->slot_of[pp_id(pp, micro, chunk)];
    pp->free_slots.push_back(*s);
    *s = -1;
    pp->in_flight--;
}
static inline int pp_global_chunk(const PipelineParallel* pp, int chunk) { return chunk * pp->p + pp->stage; }
static inline int pp_last_chunk(const PipelineParallel* pp) { return pp->v * pp->p - 1; }
static inline int pp_layer0(const PipelineParallel* pp, int chunk) {
    return pp->model->place.layer_begin + chunk * pp->model->place.chunk_stride;
}
static inline BlockGradKeep pp_keep(PipelineParallel* pp, int slot, int li) {
    size_t per_slot = pp->keep_per_layer * (size_t)gpt2_slot_layers(pp->model);
    return gpt2_keep_at(pp->model, pp->keep + (size_t)slot * per_slot + (size_t)li * pp->keep_per_layer, pp->B, pp->T);
}
static inline size_t pp_stream_count(const PipelineParallel* pp, const MicroBatch* mb) {
    return (size_t)mb->B * gpt2_place_stream_tokens(&pp->model->place, mb->T) * pp->model->config.channels;
}

// ---------------------------------------------------------------------------------------
// The actions

static inline float pp_forward(PipelineParallel* pp, const PPAction* a, const MicroBatch* mb, float dloss, int train) {
    GPT2* model = pp->model;
    int g = pp_global_chunk(pp, a->chunk), slot = pp_slot(pp, a->micro, a->chunk, mb);
    gpt2_forward_begin(model);
    if (g == 0) {
        copy_host_to_device(model->acts[slot].inputs, mb->inputs, (size_t)mb->B * mb->T * sizeof(int));
        gpt2_embed_forward(model, slot);
    }
    int l0 = pp_layer0(pp, a->chunk);
    for (int l = l0; l < l0 + gpt2_slot_layers(model); l++) { gpt2_block_forward(model, slot, l); }
    if (g != pp_last_chunk(pp)) { return 0.0f; }
    gpt2_head_forward(model, slot);
    // dloss carries the loss scale S (llmc/train/loss_scale.h); the mean loss returned does not
    return gpt2_head_loss(model, slot, mb->targets, mb->weights, dloss, train) * (train ? dloss / model->loss_scale : 1.0f);
}

static inline void pp_backward(PipelineParallel* pp, const PPAction* a, int n) {
    GPT2* model = pp->model;
    int id = pp_id(pp, a->micro, a->chunk), g = pp_global_chunk(pp, a->chunk), slot = pp->slot_of[id];
    if (slot < 0) { die("pipeline stage %d: backward of micro-batch %d before its forward", pp->stage, a->micro); }
    // data parallelism communicates in the last backward pass of each chunk (DDP's no_sync
    // before); with ZB-H1 the weight gradients come in W passes, which count instead
    if (!pp->sched.split_backward) { gpt2_micro_begin(model, pp->passes[a->chunk]++, n); }
    gpt2_backward_begin(model);
    const ActivationTensors* acts = &model->acts[slot];
    if (g == pp_last_chunk(pp)) { gpt2_head_backward(model, slot); }
    else {
        if (pp->grad_recv_owner != id) { die("pipeline stage %d: B of micro-batch %d without its received gradient", pp->stage, a->micro); }
        copy_device_to_device(model->bufs.dresidual, pp->grad_recv, (size_t)acts->B * acts->Ts * model->config.channels * sizeof(floatX));
        pp->grad_recv_owner = -1;
    }
    int l0 = pp_layer0(pp, a->chunk), nl = gpt2_slot_layers(model);
    for (int l = l0 + nl - 1; l >= l0; l--) {
        if (pp->sched.split_backward) {
            BlockGradKeep k = pp_keep(pp, slot, l - l0);
            gpt2_block_backward_input(model, slot, l, &k);
        } else {
            gpt2_block_backward(model, slot, l);
        }
    }
    if (g == 0) { gpt2_embed_backward(model, slot); }
    gpt2_backward_end(model);
    pp->dres_owner = id;   // dresidual: this micro-batch's input gradient, until the next B
    if (!pp->sched.split_backward) { pp_free_slot(pp, a->micro, a->chunk); }
}

static inline void pp_weight(PipelineParallel* pp, const PPAction* a, int n) {
    GPT2* model = pp->model;
    gpt2_micro_begin(model, pp->passes[a->chunk]++, n);
    int slot = pp->slot_of[pp_id(pp, a->micro, a->chunk)];
    int l0 = pp_layer0(pp, a->chunk), nl = gpt2_slot_layers(model);
    for (int l = l0 + nl - 1; l >= l0; l--) {
        BlockGradKeep k = pp_keep(pp, slot, l - l0);
        gpt2_block_backward_weight(model, slot, l, &k);
    }
    pp_free_slot(pp, a->micro, a->chunk);
}

// One exchange: the run of sends and receives [i, end) of this stage's list, posted together
// (comm_exchange). Where each message lives:
//   send activation     the slot's output (kept until the slot is freed at B or W)
//   receive activation  the consumer slot's input (`encoded`), taken now if it is new
//   send gradient       dresidual, as the B before left it (ZB-H1 may run W's in between: they
//                       do not touch it; the owner check below says so if that ever changes)
//   receive gradient    grad_recv, until its B copies it into dresidual
static inline void pp_exchange(PipelineParallel* pp, const std::vector<PPAction>& list, int i, int end,
                               const MicroBatchSource* batches) {
    GPT2* model = pp->model;
    CommMsg msgs[8];
    int n = 0;
    char name[96] = "";
    for (int k = i; k < end; k++) {
        const PPAction* a = &list[k];
        if (n == 8) { die("pipeline stage %d: more than 8 messages in one exchange", pp->stage); }
        MicroBatch mb = batches->get(batches->ctx, a->micro);
        int id = pp_id(pp, a->micro, a->chunk);
        int slot = a->kind == PP_RECV_ACT ? pp_slot(pp, a->micro, a->chunk, &mb) : pp->slot_of[id];
        CommMsg* msg = &msgs[n++];
        memset(msg, 0, sizeof(*msg));
        msg->count = pp_stream_count(pp, &mb);
        msg->peer = a->peer;
        msg->tag = pp_message_tag(pp_is_grad(a->kind), a->micro, pp_sender_chunk(pp->sched, pp->stage, *a));
        if (a->kind == PP_SEND_ACT) { msg->send = gpt2_stage_output(model, slot); }
        if (a->kind == PP_RECV_ACT) { msg->recv = model->acts[slot].encoded; }
        if (a->kind == PP_SEND_GRAD) {
            if (pp->dres_owner != id) { die("pipeline stage %d: the gradient of micro-batch %d to send is gone", pp->stage, a->micro); }
            msg->send = model->bufs.dresidual;
        }
        if (a->kind == PP_RECV_GRAD) {
            if (pp->grad_recv_owner >= 0) { die("pipeline stage %d: a received gradient would be overwritten", pp->stage); }
            pp->grad_recv_owner = id;
            msg->recv = pp->grad_recv;
        }
        size_t len = strlen(name);
        snprintf(name + len, sizeof(name) - len, "%s%s %c%d", len ? ", " : "", pp_is_send(a->kind) ? "send" : "recv",
                 pp_is_grad(a->kind) ? 'g' : 'a', a->micro);
    }
    double t0 = trace_now();
    comm_exchange(pp->comm, msgs, n, COMM_FLOATX);
    pp->comm_seconds += trace_now() - t0;
    trace_event(name, 3, t0);
}

// The embedding group's sum of dwte (first and last stage), then the data-parallel layer may
// reduce the root's gradients over the replicas.
static inline void pp_sum_embedding_grads(PipelineParallel* pp) {
    GPT2* m = pp->model;
    if (pp->p > 1 && (m->place.has_embedding || m->place.has_head)) {
        size_t n = m->param_info[0].numel;   // wte: Vp/tp x C
        double t0 = trace_now();
        if (pp->use_ring) { allreduce_ring(&pp->embed, m->root_grads.wte, m->root_grads.wte, n, COMM_FLOATX, COMM_SUM); }
        else { allreduce_native(&pp->embed, m->root_grads.wte, m->root_grads.wte, n, COMM_FLOATX, COMM_SUM); }
        pp->comm_seconds += trace_now() - t0;
        trace_event("embedding group: all-reduce dwte", 3, t0);
    }
    if (pp->root_done) { pp->root_done(pp->dp); }
}

// ---------------------------------------------------------------------------------------
// The step (GPT2Step.run): this stage's list, action by action.

static inline float pp_step_run(void* ctx, GPT2* model, const MicroBatchSource* batches, int n, float dloss) {
    PipelineParallel* pp = (PipelineParallel*)ctx;
    (void)model;   // pp->model: the same
    if (n != pp->m) { die("the pipeline schedule was built for %d micro-batches, the step has %d", pp->m, n); }
    const std::vector<PPAction>& list = pp->sched.stages[pp->stage];
    std::fill(pp->passes.begin(), pp->passes.end(), 0);
    memset(pp->act_seconds, 0, sizeof(pp->act_seconds));
    memset(pp->act_count, 0, sizeof(pp->act_count));
    pp->comm_seconds = 0.0;
    pp->busy = 0.0;
    pp->peak_in_flight = 0;
    pp->bytes_start = pp->comm->bytes_sent;
    pp->embed_bytes_start = pp->embed.bytes_sent;
    pp->t_start = trace_now();
    pp->grad_recv_owner = pp->dres_owner = -1;
    double loss = 0.0;
    for (int i = 0; i < (int)list.size();) {
        const PPAction* a = &list[i];
        if (a->kind != PP_F && a->kind != PP_B && a->kind != PP_W) {
            int end = pp_exchange_end(list, i);
            pp_exchange(pp, list, i, end, batches);
            i = end;
            continue;
        }
        double t0 = trace_now();
        MicroBatch mb = batches->get(batches->ctx, a->micro);
        if (a->kind == PP_F) { loss += pp_forward(pp, a, &mb, dloss, 1); }
        if (a->kind == PP_B) { pp_backward(pp, a, n); }
        if (a->kind == PP_W) { pp_weight(pp, a, n); }
        double dt = trace_now() - t0;
        int k = a->kind == PP_F ? 0 : a->kind == PP_B ? 1 : 2;
        pp->act_seconds[k] += dt;
        pp->act_count[k]++;
        pp->busy += dt;
        char name[32];
        snprintf(name, sizeof(name), "%c%d%s", "FBW"[k], a->micro, pp->v > 1 ? (a->chunk == 0 ? "" : a->chunk == 1 ? "'" : "''") : "");
        trace_event(name, 0, t0);
        i++;
    }
    pp->t_end = trace_now();
    pp_sum_embedding_grads(pp);
    // the loss is known on the last stage: every stage returns it (rank 0, the first stage, prints)
    float out = (float)loss;
    MPI_Bcast(&out, 1, MPI_FLOAT, pp->p - 1, pp->comm->mpi);
    pp->loss = out;
    return out;
}

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

// ---------------------------------------------------------------------------------------
// What the update asks of the pipeline (dp_core.h's ShardGroup): the gradient norm is summed
// over the stages (after the tp group's sum); gradients completed as the tp group says.

static inline void pp_complete_grads(void* ctx, int tensor, floatX* grad, size_t n) {
    PipelineParallel* pp = (PipelineParallel*)ctx;
    if (pp->inner.complete_grads) { pp->inner.complete_grads(pp->inner.ctx, tensor, grad, n); }
}
static inline double pp_sum_norm(void* ctx, double sq) {
    PipelineParallel* pp = (PipelineParallel*)ctx;
    if (pp->inner.sum_norm) { sq = pp->inner.sum_norm(pp->inner.ctx, sq); }
    MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, pp->comm->mpi);   // 8 bytes, not counted
    return sq;
}
static inline ShardGroup pp_shard_group(PipelineParallel* pp) { return ShardGroup{pp, pp_complete_grads, pp_sum_norm}; }

// ---------------------------------------------------------------------------------------
// Setting up (collective over the pp group): the schedule, checked; the activation slots for
// its peak in flight (the model's activations are allocated again); the embedding group.

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
    pp->loss = 0.0f;
    std::string err = pp_schedule_check(kind, pp->p, m, v);
    if (!err.empty()) { die("--pp-schedule %s: %s", pp_schedule_name(kind), err.c_str()); }
    pp->sched = pp_build(kind, pp->p, m, v);
    err = pp_validate(pp->sched);
    if (!err.empty()) { die("pipeline schedule %s (p %d, m %d, v %d) is invalid: %s", pp_schedule_name(kind), pp->p, m, v, err.c_str()); }
    pp->sim_equal = pp_simulate(pp->sched, PPCosts{1.0, 1.0, 1.0, 0.0});
    int slots = pp_peak_inflight(pp->sched)[pp->stage];
    pp->B = model->max_B;
    pp->T = model->max_T;
    gpt2_allocate_activations_slots(model, pp->B, pp->T, slots);
    pp->slot_of.assign((size_t)m * v, -1);
    pp->free_slots.clear();
    for (int s = slots - 1; s >= 0; s--) { pp->free_slots.push_back(s); }
    pp->in_flight = pp->peak_in_flight = 0;
    pp->grad_recv_owner = pp->dres_owner = -1;
    pp->passes.assign(v, 0);
    size_t stream = (size_t)pp->B * gpt2_place_stream_tokens(&model->place, pp->T) * model->config.channels;
    pp->grad_recv = (floatX*)device_malloc(stream * sizeof(floatX));
    pp->buffer_bytes = stream * sizeof(floatX);
    pp->keep = NULL;
    pp->keep_per_layer = 0;
    if (pp->sched.split_backward) {
        pp->keep_per_layer = gpt2_keep_floats(model, pp->B, pp->T);
        size_t bytes = pp->keep_per_layer * gpt2_slot_layers(model) * (size_t)slots * sizeof(floatX);
        pp->keep = (floatX*)device_malloc(bytes);
        pp->buffer_bytes += bytes;
    }
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

// ---------------------------------------------------------------------------------------
// What the formulas predict, and what the trainer prints

// bytes this stage sends in one step (the header's cost)
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
    std::vector<int> peak = pp_peak_inflight(pp->sched);
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
    const PPSim& sim = pp->sim_equal;
    printf("  bubble     %.3f simulated with F = B = W, formula %.3f; tied wte summed over stages 0 and %d\n", sim.bubble,
           pp_formula_bubble(pp->kind, pp->p, pp->m, pp->v, eq), pp->p - 1);
    if (print_timeline) {
        printf("pipeline schedule (--pp-print), F = B = W = 1 time unit:\n");
        pp_print_timeline(stdout, pp->sched, sim);
        pp_print_lists(stdout, pp->sched);
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
           pp->sched.split_backward ? ", ZB-H1's kept output gradients per slot and layer" : "");
    printf("pp memory check %s (measured %s formula on all %d stages)\n", all_ok ? "ok" : "FAILED", all_ok ? "=" : "!=", pp->p);
    return all_ok;
}

// After each step: bytes against the formula, the peak in flight against the schedule's, and the
// bubble measured against the one simulated with the measured F/B/W times and the formula.
// Collective over the pp group (every rank calls it; rank 0 prints).
static inline void pp_report_step(PipelineParallel* pp, int B, int T) {
    uint64_t sent = pp->comm->bytes_sent - pp->bytes_start, want = pp_formula_bytes(pp, B, T);
    uint64_t esent = pp->embed.bytes_sent - pp->embed_bytes_start, ewant = pp_formula_embed_bytes(pp);
    int peak_want = pp_peak_inflight(pp->sched)[pp->stage];
    // per stage: wall time of the schedule, busy time; mean action times over the stages
    double span = pp->t_end - pp->t_start, local[8] = {pp->busy, pp->act_seconds[0], pp->act_seconds[1], pp->act_seconds[2],
                                                       (double)pp->act_count[0], (double)pp->act_count[1],
                                                       (double)pp->act_count[2], 0.0};
    double sums[8], max_span = span;
    MPI_Allreduce(local, sums, 8, MPI_DOUBLE, MPI_SUM, pp->comm->mpi);
    MPI_Allreduce(MPI_IN_PLACE, &max_span, 1, MPI_DOUBLE, MPI_MAX, pp->comm->mpi);
    int ok = sent == want && esent == ewant && pp->peak_in_flight == peak_want, all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, pp->comm->mpi);
    double measured = max_span > 0 ? 1.0 - sums[0] / (pp->p * max_span) : 0.0;
    PPCosts c = {sums[4] > 0 ? sums[1] / sums[4] : 0.0, sums[5] > 0 ? sums[2] / sums[5] : 0.0, sums[6] > 0 ? sums[3] / sums[6] : 0.0, 0.0};
    if (!pp->sched.split_backward) { c.w = 0.0; }   // B is the whole backward: its measured time already holds W
    PPSim sim = pp_simulate(pp->sched, c);
    printf("  pp comm | sent %9.3f MiB (formula %9.3f MiB, %s) + embedding group %.3f MiB (formula %.3f) | "
           "in flight %d (schedule %d) | %.1f ms | check %s\n",
           sent / 1048576.0, want / 1048576.0, sent == want ? "equal" : "DIFFERENT", esent / 1048576.0, ewant / 1048576.0,
           pp->peak_in_flight, peak_want, pp->comm_seconds * 1e3, all_ok ? "ok" : "FAILED");
    printf("  pp bubble | measured %.3f | simulated %.3f with the measured F %.2f, B %.2f, W %.2f ms | formula %.3f\n", measured,
           sim.bubble, c.f * 1e3, c.b * 1e3, c.w * 1e3, pp_formula_bubble(pp->kind, pp->p, pp->m, pp->v, c));
}
