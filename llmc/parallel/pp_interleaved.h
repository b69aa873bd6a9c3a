// Megatron-LM's interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
// Training on GPU Clusters Using Megatron-LM"): each stage holds v model chunks instead of one.
// The model is cut into v p chunks; global chunk g = chunk * p + stage, so stage s holds
// g = s, s+p, s+2p, ... and the activations go 0 -> 1 -> ... -> p-1 -> 0 -> 1 ... (v times
// round the ring).
//
// The order of stage s: the k-th of its m v forwards is micro-batch (k / (p v)) p + k % p on
// local chunk (k / p) % v (groups of p micro-batches, each group through the v chunks in turn),
// the k-th backward the same micro-batch on chunk v-1-(k/p)%v; warm-up
// w = min(2(p-s-1) + (v-1)p, m v) forwards, then F and B in pairs, then the rest of the B's.
// Needs m % p == 0 (groups of p micro-batches) and p >= 2. At most min(w + 1, m v) chunk
// activations are in flight on stage s.
//
// The bubble: a stage's work per micro-batch is v chunks, t_f = v f and t_b = v (b + w), but
// the pipeline fills and drains one chunk at a time, so t_pb = (p-1)(t_f + t_b) / v:
// (1/v)(p-1)/m of the ideal time (the lecture's normalisation), (p-1)/(v m + p-1) of the step
// (this code's). The price: v times more messages.
//
// The messages: an exchange around each of Megatron-LM's steps, each warm-up F, each steady
// pair F B, each cool-down B; a pair is F(i) B(j) [send a(i) send g(j) recv a(i') recv g(j')],
// Megatron-LM's send_forward_backward_recv_forward_backward. With an exchange between F and B,
// every stage would wait in a send of a gradient to its predecessor while that one waits in its
// own (the chunks form a ring: stage p-1 feeds stage 0): deadlock.
#pragma once

#include "pp_1f1b.h"

// the micro-batch of a stage's k-th forward (or backward)
static inline int pp_interleaved_micro(int k, int p, int v) { return (k / (p * v)) * p + k % p; }

// stage s's compute, cut into Megatron-LM's steps (pp_with_messages puts the exchanges between them)
static inline PPSteps pp_interleaved_steps(int p, int m, int v, int s) {
    PPSteps steps;
    int total = m * v;
    int w = std::min(2 * (p - s - 1) + (v - 1) * p, total);
    for (int k = 0; k < w; k++) {
        steps.push_back(std::vector<PPAction>());
        pp_push(steps.back(), PP_F, pp_interleaved_micro(k, p, v), (k / p) % v, -1);
    }
    for (int k = 0; k < total - w; k++) {
        steps.push_back(std::vector<PPAction>());
        pp_push(steps.back(), PP_F, pp_interleaved_micro(w + k, p, v), ((w + k) / p) % v, -1);
        pp_push(steps.back(), PP_B, pp_interleaved_micro(k, p, v), v - 1 - (k / p) % v, -1);
    }
    for (int k = total - w; k < total; k++) {
        steps.push_back(std::vector<PPAction>());
        pp_push(steps.back(), PP_B, pp_interleaved_micro(k, p, v), v - 1 - (k / p) % v, -1);
    }
    return steps;
}
