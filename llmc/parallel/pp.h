// Pipeline parallelism, the executor: the model's layers split over the p ranks of the pp group
// (stages); each stage runs its list of a schedule (pp_1f1b.h) action by action on the
// model's pieces (gpt2.h), as the plan's step (model/step.h).
//
//   stage 0          stage 1          stage 2          stage 3
//   [emb|blk 0-1] -> [blk 2-3]     -> [blk 4-5]     -> [blk 6-7|lnf|head|loss]    activations
//                 <-               <-               <-                            gradients
//   wte (lookup) ............ embedding group: dwte summed ............ wte (LM head)
//
// Between neighbours travel one micro-batch's activations (forward) or their gradients
// (backward): B_micro x Ts x C values (Ts = T, or T/tp with sequence parallelism). Each F takes
// an activation slot until its B: the schedule's peak in flight (1F1B p - s on stage s, GPipe m)
// is what the stage allocates. With v interleaved chunks (pp_interleaved.h) stage s holds global
// chunks g = c p + s, c < v (pp_setup.h places the layers).
//
// The tied embedding: wte lives on the first stage (the lookup) and the last (the LM head), as
// in Megatron-LM. Each accumulates its part of dwte; after the last backward the two sum them
// over the embedding group (an all-reduce between stages 0 and p-1), so both copies get the
// same gradient and the same AdamW update, and stay identical.
//
// Cost per step, per stage (bytes sent, a = bytes per value; pp_accounting.h checks them):
//   activations   m (v - [s = p-1]) B Ts C a      gradients   m (v - [s = 0]) B Ts C a
//   embedding     2 (2-1)/2 Vp C/tp a  (an all-reduce of dwte between two ranks)
// and in time the bubble: (p-1)/m of the ideal time, (p-1)/(m+p-1) of the step (pp_1f1b.h).
#pragma once

#include <vector>
#include "../model/gpt2.h"
#include "../model/step.h"
#include "../comm/native.h"
#include "../comm/ring.h"
#include "dp_core.h"
#include "pp_1f1b.h"
#include "pp_measure.h"

typedef struct PipelineParallel {
    Comm* comm;              // the pp group: the stages of this replica (mesh.dim[MESH_PP])
    Comm embed;              // the embedding group: stages 0 and p-1 (a group of one elsewhere)
    int p, stage, v, m, kind;
    int use_ring;            // 1: our ring all-reduce for the embedding group (bytes counted)
    PPSchedule schedule;
    GPT2* model;
    // activation slots: one per (micro-batch, chunk) in flight
    std::vector<int> slot_of;      // [micro * v + chunk] -> slot, or -1
    std::vector<int> free_slots;
    int in_flight, peak_in_flight;
    std::vector<int> passes;       // [chunk] backward passes of the chunk done this step
    floatX* grad_recv;             // (B, Ts, C) a received activation gradient
    int grad_recv_owner, dres_owner;   // whose gradient grad_recv / dresidual hold (micro v + chunk), or -1
    // B and W: the whole backward in B (pp_backward), or ZB-H1's halves (pp_split_backward.h)
    void (*backward)(struct PipelineParallel* pp, const PPAction* a, int n);
    void (*weight)(struct PipelineParallel* pp, const PPAction* a, int n);
    floatX* keep;                  // ZB-H1: per slot and layer, what W needs (BlockGradKeep)
    size_t keep_per_layer;         // floatX per layer of a slot
    size_t buffer_bytes;           // grad_recv + keep
    // what the update needs from the rest of the plan
    ShardGroup inner;              // the tp group's (or none)
    void* dp;                      // the data-parallel layer: told when the tied wte's gradient is whole
    void (*root_done)(void* dp);
    uint64_t bytes_start, embed_bytes_start;   // the pp and embedding groups' bytes sent before this step
    PPMeasure measured;            // this step's times (pp_measure.h)
} PipelineParallel;

// ---- slots

static inline int pp_id(const PipelineParallel* pp, int micro, int chunk) { return micro * pp->v + chunk; }   // slot_of's index

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
static inline size_t pp_stream_count(const PipelineParallel* pp, const MicroBatch* mb) {
    return (size_t)mb->B * gpt2_place_stream_tokens(&pp->model->place, mb->T) * pp->model->config.channels;
}

// ---- the compute: F and B of one micro-batch on one chunk of this stage

// F(i, c): the forward into the micro-batch's slot; on the first global chunk from the tokens,
// else from the activations received; on the last also the head and the loss (which writes dlogits)
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

// The chunk's backward, top down, from the loss (on the last global chunk) or from the gradient
// received from the next stage; layer(pp, slot, l, i) runs layer l, the chunk's i-th. It leaves
// the input's gradient in dresidual, to be sent to the previous stage.
static inline void pp_backward_chunk(PipelineParallel* pp, const PPAction* a, int slot,
                                     void (*layer)(PipelineParallel* pp, int slot, int l, int i)) {
    GPT2* model = pp->model;
    int id = pp_id(pp, a->micro, a->chunk), g = pp_global_chunk(pp, a->chunk);
    gpt2_backward_begin(model);
    const ActivationTensors* acts = &model->acts[slot];
    if (g == pp_last_chunk(pp)) { gpt2_head_backward(model, slot); }
    else {
        if (pp->grad_recv_owner != id) { die("pipeline stage %d: B of micro-batch %d without its received gradient", pp->stage, a->micro); }
        copy_device_to_device(model->bufs.dresidual, pp->grad_recv, (size_t)acts->B * acts->Ts * model->config.channels * sizeof(floatX));
        pp->grad_recv_owner = -1;
    }
    int l0 = pp_layer0(pp, a->chunk), nl = gpt2_slot_layers(model);
    for (int l = l0 + nl - 1; l >= l0; l--) { layer(pp, slot, l, l - l0); }
    if (g == 0) { gpt2_embed_backward(model, slot); }
    gpt2_backward_end(model);
    pp->dres_owner = id;   // dresidual: this micro-batch's input gradient, until the next B
}

static inline void pp_block_backward(PipelineParallel* pp, int slot, int l, int i) {
    (void)i;
    gpt2_block_backward(pp->model, slot, l);
}

// B(i, c): the whole backward; then the slot is free. Data parallelism communicates in the
// last backward pass of each chunk (DDP's no_sync before), so the passes are counted.
static inline void pp_backward(PipelineParallel* pp, const PPAction* a, int n) {
    int slot = pp->slot_of[pp_id(pp, a->micro, a->chunk)];
    if (slot < 0) { die("pipeline stage %d: backward of micro-batch %d before its forward", pp->stage, a->micro); }
    gpt2_micro_begin(pp->model, pp->passes[a->chunk]++, n);
    pp_backward_chunk(pp, a, slot, pp_block_backward);
    pp_free_slot(pp, a->micro, a->chunk);
}

// ---- the messages

// One exchange: the run of sends and receives [i, end) of this stage's list, posted together
// (comm_exchange: MPI_Isend/Irecv + Waitall, or ncclSend/ncclRecv in one group), returning when
// all are through; pp_validate.h proved that no ordering of ranks can deadlock. Where they live:
//   send activation     the slot's output (kept until the slot is freed at B or W)
//   receive activation  the consumer slot's input (`encoded`), taken now if it is new
//   send gradient       dresidual, as the B before left it (ZB-H1 may run W's in between: they
//                       do not touch it; the owner check below says so if that ever changes)
//   receive gradient    grad_recv, until its B copies it into dresidual
static inline void pp_exchange(PipelineParallel* pp, const std::vector<PPAction>& list, int i, int end,
                               const MicroBatchSource* batches) {
    GPT2* model = pp->model;
    std::vector<CommMsg> msgs(end - i);   // zeroed: no buffer until set below
    char name[96] = "";
    for (int k = i; k < end; k++) {
        const PPAction* a = &list[k];
        MicroBatch mb = batches->get(batches->ctx, a->micro);
        int id = pp_id(pp, a->micro, a->chunk);
        int slot = a->kind == PP_RECV_ACT ? pp_slot(pp, a->micro, a->chunk, &mb) : pp->slot_of[id];
        CommMsg* msg = &msgs[k - i];
        msg->count = pp_stream_count(pp, &mb);
        msg->peer = a->peer;
        msg->tag = pp_message_tag(pp_is_grad(a->kind), a->micro, pp_sender_chunk(pp->schedule, pp->stage, *a));
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
        pp_measure_name(name, sizeof(name), a);
    }
    double t0 = trace_now();
    comm_exchange(pp->comm, msgs.data(), (int)msgs.size(), COMM_FLOATX);
    pp_measure_comm(&pp->measured, name, t0);
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
        pp_measure_comm(&pp->measured, "embedding group: all-reduce dwte", t0);
    }
    if (pp->root_done) { pp->root_done(pp->dp); }
}

// ---- what the update asks of the pipeline (pp_setup.h hands these to it as a ShardGroup)

// dp_core.h's ShardGroup: the gradient norm is summed over the stages (after the tp group's
// sum); gradients completed as the tp group says.
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

// ---- the step (GPT2Step.run): this stage's list, action by action

static inline float pp_step_run(void* ctx, GPT2* model, const MicroBatchSource* batches, int n, float dloss) {
    PipelineParallel* pp = (PipelineParallel*)ctx;
    (void)model;   // pp->model: the same
    if (n != pp->m) { die("the pipeline schedule was built for %d micro-batches, the step has %d", pp->m, n); }
    const std::vector<PPAction>& list = pp->schedule.stages[pp->stage];
    std::fill(pp->passes.begin(), pp->passes.end(), 0);
    pp->peak_in_flight = 0;
    pp->bytes_start = pp->comm->bytes_sent;
    pp->embed_bytes_start = pp->embed.bytes_sent;
    pp_measure_start(&pp->measured);
    pp->grad_recv_owner = pp->dres_owner = -1;
    double loss = 0.0;
    for (int i = 0; i < (int)list.size();) {
        const PPAction* a = &list[i];
        if (pp_is_comm(a->kind)) {
            int end = pp_exchange_end(list, i);
            pp_exchange(pp, list, i, end, batches);
            i = end;
            continue;
        }
        double t0 = trace_now();
        MicroBatch mb = batches->get(batches->ctx, a->micro);
        if (a->kind == PP_F) { loss += pp_forward(pp, a, &mb, dloss, 1); }
        if (a->kind == PP_B) { pp->backward(pp, a, n); }
        if (a->kind == PP_W) { pp->weight(pp, a, n); }
        pp_measure_compute(&pp->measured, a, pp->v, t0);
        i++;
    }
    pp->measured.t_end = trace_now();
    pp_sum_embedding_grads(pp);
    // the loss is known on the last stage: every stage returns it (rank 0, the first stage, prints)
    float out = (float)loss;
    MPI_Bcast(&out, 1, MPI_FLOAT, pp->p - 1, pp->comm->mpi);
    return out;
}
