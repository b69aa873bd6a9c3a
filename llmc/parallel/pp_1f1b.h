// Pipeline schedules as data: for each of the p stages, the ordered list of what it runs, the
// forward (F) and backward (B) of a micro-batch and the sends and receives between them. The
// executor (pp.h) walks these lists; nothing here knows the model.
//
// 1F1B, p = 4 stages, m = 8 micro-batches, t_b = 2 t_f (./pp_simcpu --schedule 1f1b --p 4 --m 8):
//
//   stage 0 |F0 F1 F2 F3 ..................B0--- F4 B1--- F5 B2--- F6 B3--- F7 B4--- ...B5--- ...B6--- ...B7---
//   stage 1 |...F0 F1 F2 ............B0--- F3 B1--- F4 B2--- F5 B3--- F6 B4--- F7 B5--- ...B6--- ...B7--- ......
//   stage 2 |......F0 F1 ......B0--- F2 B1--- F3 B2--- F4 B3--- F5 B4--- F6 B5--- F7 B6--- ...B7--- ............
//   stage 3 |.........F0 B0--- F1 B1--- F2 B2--- F3 B3--- F4 B4--- F5 B5--- F6 B6--- F7 B7--- ..................
//
// Stage s warms up with w = p-1-s forwards, then runs one F and one B in turn, then the last w
// B's: it holds at most p - s micro-batches' activations (GPipe, every F and then every B: m).
//
// The bubble (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
// Using Megatron-LM"), with t_f and t_b one stage's forward and backward of a micro-batch: the
// last stage waits (p-1) t_f for its first activation; stage 0 waits (p-1) t_b for its first
// gradient in 1F1B and (p-1)(t_f + t_b) in GPipe. Over the step every stage idles
// t_pb = (p-1)(t_f + t_b), in both, while it works t_ideal = m (t_f + t_b). Two normalisations:
//     t_pb / t_ideal          = (p-1) / m          the lecture's: the bubble over the ideal time
//     t_pb / (t_pb + t_ideal) = (p-1) / (m + p-1)  this code's: the bubble's share of the step
// Above: 3/8 = 0.375 and 3/11 = 0.273 (9 of the 33 time units idle on every stage). 1F1B does
// not shrink the bubble, it shrinks the memory; more micro-batches shrink the bubble.
//
// Cost: per micro-batch one message forward (its activations) and one back (their gradient)
// between neighbours, B_micro x T x C values each (pp.h counts the bytes).
//
// The messages: an F receives its input activation from the stage before it (none on the first
// chunk) and sends its output to the next (none on the last); a B the same with gradients, the
// other way. A run of sends and receives is ONE exchange, posted together, complete when all its
// messages are (ncclGroupStart/End, or MPI Isend/Irecv then Waitall), sends first. 1F1B's steady
// state: F(i) [send a(i) recv g(j)] B(j) [send g(j) recv a(i+1)] F(i+1) ..., Megatron-LM's
// send_forward_recv_backward and send_backward_recv_forward. NCCL matches the messages between
// two ranks by order, so both ends list them in the same order (pp_validate.h checks it).
#pragma once

#include <string.h>
#include <string>
#include <vector>
#include <algorithm>
#include "../common.h"

enum { PP_GPIPE, PP_1F1B, PP_INTERLEAVED, PP_ZBH1, PP_NUM_SCHEDULES };
// one action of a stage's list
enum { PP_F, PP_B, PP_W, PP_SEND_ACT, PP_RECV_ACT, PP_SEND_GRAD, PP_RECV_GRAD };

typedef struct {
    int kind;    // PP_F ... PP_RECV_GRAD
    int micro;   // micro-batch 0..m-1
    int chunk;   // LOCAL model chunk on this stage, 0..v-1 (global chunk g = chunk * p + stage);
                 // for a send, the chunk whose F/B produced the data, for a receive the one that consumes it
    int peer;    // pp rank of the other end for send/recv actions, -1 for compute
} PPAction;

typedef struct {
    int kind, p, m, v;       // schedule, stages, micro-batches, chunks per stage (v = 1 except interleaved)
    int split_backward;      // 1 (ZB-H1): PP_B is the input gradient only and PP_W the weight gradient;
                             // 0: PP_B is the whole backward and there are no PP_W actions
    std::vector<std::vector<PPAction>> stages;   // [p] ordered lists
} PPSchedule;

// message tags: m <= PP_MAX_MICRO, v * p <= PP_MAX_CHUNKS keep every tag below 32767 (MPI's
// smallest allowed MPI_TAG_UB)
#define PP_MAX_MICRO 64
#define PP_MAX_CHUNKS 128

static inline int pp_is_comm(int kind) { return kind >= PP_SEND_ACT && kind <= PP_RECV_GRAD; }
static inline int pp_is_send(int kind) { return kind == PP_SEND_ACT || kind == PP_SEND_GRAD; }
static inline int pp_is_grad(int kind) { return kind == PP_SEND_GRAD || kind == PP_RECV_GRAD; }

// the global chunk whose output a communication action carries (the sender's)
static inline int pp_sender_chunk(const PPSchedule& s, int stage, const PPAction& a) {
    int g = a.chunk * s.p + stage;
    if (a.kind == PP_RECV_ACT) { return g - 1; }
    if (a.kind == PP_RECV_GRAD) { return g + 1; }
    return g;
}

// a small non-negative MPI tag, unique per message of a step: < 2 * 128 * 64 = 16384
static inline int pp_message_tag(int is_grad, int micro, int sender_global_chunk) {
    return ((is_grad ? 1 : 0) * PP_MAX_CHUNKS + sender_global_chunk) * PP_MAX_MICRO + micro;
}

// one past the exchange (the run of sends and receives) starting at i; i if there is none
static inline int pp_exchange_end(const std::vector<PPAction>& list, int i) {
    int j = i;
    while (j < (int)list.size() && pp_is_comm(list[j].kind)) { j++; }
    return j;
}

static inline void pp_push(std::vector<PPAction>& list, int kind, int micro, int chunk, int peer) {
    PPAction a = {kind, micro, chunk, peer};
    list.push_back(a);
}

// ---- the compute order of stage s

// GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline
// Parallelism"): every forward, then every backward, the last micro-batch's first
static inline std::vector<PPAction> pp_gpipe_order(int m) {
    std::vector<PPAction> o;
    for (int i = 0; i < m; i++) { pp_push(o, PP_F, i, 0, -1); }
    for (int i = m - 1; i >= 0; i--) { pp_push(o, PP_B, i, 0, -1); }
    return o;
}

// 1F1B (PipeDream-Flush, Narayanan et al.): w warm-up forwards, F and B in turn, the last w B's
static inline std::vector<PPAction> pp_1f1b_order(int p, int m, int s) {
    std::vector<PPAction> o;
    int w = std::min(p - s - 1, m);
    for (int i = 0; i < w; i++) { pp_push(o, PP_F, i, 0, -1); }
    for (int i = 0; i < m - w; i++) {
        pp_push(o, PP_F, w + i, 0, -1);
        pp_push(o, PP_B, i, 0, -1);
    }
    for (int i = m - w; i < m; i++) { pp_push(o, PP_B, i, 0, -1); }
    return o;
}

// ---- the messages around the compute

// A stage's compute cut into steps: the exchange between two steps sends what the first
// produced and receives what the second needs. Every action is a step of its own, except in
// the interleaved schedule's steady state (pp_interleaved.h).
typedef std::vector<std::vector<PPAction>> PPSteps;

// stage s's list: each step's receives of its inputs before it, the sends of its outputs after it
static inline std::vector<PPAction> pp_with_messages(const PPSteps& steps, int p, int v, int s) {
    std::vector<PPAction> list;
    int last = v * p - 1;   // the global chunk with the loss
    for (const std::vector<PPAction>& step : steps) {
        for (const PPAction& a : step) {
            int g = a.chunk * p + s;
            if (a.kind == PP_F && g > 0) { pp_push(list, PP_RECV_ACT, a.micro, a.chunk, (g - 1) % p); }
            if (a.kind == PP_B && g < last) { pp_push(list, PP_RECV_GRAD, a.micro, a.chunk, (g + 1) % p); }
        }
        for (const PPAction& a : step) { list.push_back(a); }
        for (const PPAction& a : step) {
            int g = a.chunk * p + s;
            if (a.kind == PP_F && g < last) { pp_push(list, PP_SEND_ACT, a.micro, a.chunk, (g + 1) % p); }
            if (a.kind == PP_B && g > 0) { pp_push(list, PP_SEND_GRAD, a.micro, a.chunk, (g - 1) % p); }
        }
    }
    return list;
}
