// Pipeline schedules as data: for each of p stages, the ordered list of what it runs, forward
// (F), backward (B), weight gradient (W), and the sends and receives between them. The executor
// (llmc/parallel/pp.h) walks these lists; a simulator here times them, a validator proves them
// (every message matched, in order, no deadlock), a printer draws the lecture's picture. Nothing
// here knows the model: a list says "F of micro-batch 3 on my chunk 1", not which layers.
//
// p stages, m micro-batches, v model chunks per stage (v > 1: interleaved only). The model is
// cut into v*p chunks; global chunk g = chunk * p + stage, so stage s holds g = s, s+p, s+2p, ...
// and the activations go 0 -> 1 -> ... -> p-1 -> 0 -> 1 ... (v times round the ring).
// p = 4, m = 8, f = b = w = 1 (./pp_simcpu --schedule all --p 4 --m 8); 1f1b's B is the whole
// backward (2 units), zb-h1 splits it into B and W:
//
//  1f1b   stage 0 |F0 F1 F2 F3 ..................B0--- F4 B1--- F5 B2--- F6 B3--- F7 B4--- ...B5--- ...B6--- ...B7---
//         stage 1 |...F0 F1 F2 ............B0--- F3 B1--- F4 B2--- F5 B3--- F6 B4--- F7 B5--- ...B6--- ...B7--- ......
//         stage 2 |......F0 F1 ......B0--- F2 B1--- F3 B2--- F4 B3--- F5 B4--- F6 B5--- F7 B6--- ...B7--- ............
//         stage 3 |.........F0 B0--- F1 B1--- F2 B2--- F3 B3--- F4 B4--- F5 B5--- F6 B6--- F7 B7--- ..................
//  zb-h1  stage 0 |F0 F1 F2 F3 .........B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7
//         stage 1 |...F0 F1 F2 ......B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7
//         stage 2 |......F0 F1 ...B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7
//         stage 3 |.........F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7
//  makespan 33 (bubble 27%) against 27 (11%): the B's walk back without their W's, which fill the tail.
//
// The four schedules, the compute order of stage s:
//   gpipe        F0 .. F(m-1), then B(m-1) .. B0 (GPipe, Huang et al. 2019): m in flight.
//   1f1b         PipeDream-Flush (Narayanan et al. 2021): w = min(p-s-1, m) warm-up forwards,
//                then F, B alternating while forwards remain, then the last w B's: at most
//                min(p-s, m) micro-batches in flight on stage s.
//   interleaved  Megatron-LM's interleaved 1F1B (Narayanan et al. 2021): v chunks per stage;
//                the k-th of its m*v forwards is micro-batch (k / (p v)) p + k % p on local
//                chunk (k / p) % v, the k-th backward the same micro-batch on chunk
//                v-1-(k/p)%v; warm-up w = min(2(p-s-1) + (v-1)p, m v), then alternate, then
//                the rest of the B's. Needs m % p == 0 (groups of p micro-batches) and p >= 2.
//   zb-h1        Zero Bubble's ZB-H1 (Qi et al. 2023, section 2.1): the backward split into B
//                (gradient of the input, on the critical path) and W (gradient of the weights,
//                free to wait). Stage s runs 1F1B's order of F and B, and W(i) right after
//                B(i+s); its last s W's at the end. Stage 0 runs F B W F B W, stage p-1
//                F B F B .. and its first W after p-1 B's: each stage defers its W's by the
//                warm-up forwards it lacks, p-1-w (the paper: "adjust the starting points of W
//                passes according to the number of warm-up micro-batches"), so every stage has
//                min(p, m) micro-batches between F and W, 1F1B's stage 0 count.
//                Why not a greedy list scheduler (every unit step each stage runs a ready B,
//                else a F within a memory limit, else a pending W)? Tried with F = B = W = 1,
//                p = 4, m = 8, where the bound is 3m + p-1 = 27: with 1F1B's limit min(p-s, m)
//                counted from F to W it takes 30 (the last stage must run F B W F B W, so its
//                last B starts at 3m + p-3 and reaches stage 0 p-1 steps later, whatever the
//                others do: 3m + 2(p-1)); with the limit min(p, m) it takes 29 (stage 0 runs B1
//                before F4 and starves the stages below of forwards). The rule above takes 27,
//                and 3m + p-1 for every p, m >= p of the test's grid.
//
// Communication. Each compute action of global chunk g needs or makes one message:
//   F, g > 0:        RECV_ACT  from (g-1) % p before it     F, g < vp-1:  SEND_ACT  to (g+1) % p after it
//   B, g < vp-1:     RECV_GRAD from (g+1) % p before it     B, g > 0:     SEND_GRAD to (g-1) % p after it
// (W none). A run of consecutive communication actions is ONE exchange, posted together (an
// ncclGroupStart/End of its sends and receives, or MPI Isend/Irecv then Waitall); sends first;
// pp_exchange_end finds its end. Where the messages go in the lists:
//   gpipe, 1f1b  right before / right after the compute. 1F1B's steady state is
//                F(i) [send a(i) recv g(j)] B(j) [send g(j) recv a(i+1)] F(i+1) ..., Megatron's
//                send_forward_recv_backward and send_backward_recv_forward.
//   interleaved  the same around Megatron's steps: each warm-up F, each steady pair F B, each
//                cool-down B; so a pair is F(i) B(j) [send a(i) send g(j) recv a(i') recv g(j')],
//                Megatron's send_forward_backward_recv_forward_backward. With an exchange between
//                F and B, every stage waits in a send of a gradient to its predecessor while that
//                one waits in its own (the chunks form a ring: stage p-1 feeds stage 0): deadlock.
//   zb-h1        each message at the moment its consumer starts in the unit-cost timeline
//                (F = B = W = 1, data dependencies only), on both ends: the receive stays right
//                before its compute, the send moves after its producer to that moment, past at
//                most some W's (pp_place_comm_timed). Placed as 1f1b's, a stage that finished
//                B(i) early would wait in its send until its predecessor, busy with W's, reaches
//                the receive: p = 4, m = 8 takes 33 units instead of 27.
// A message is (activation or gradient, micro-batch, sender's global chunk); NCCL matches
// point-to-point messages between two ranks by order, not by tag, so for every ordered pair of
// stages the sends and the receives list the same messages in the same order (pp_validate).
// MPI may match by tag instead: pp_message_tag.
//
// Rendezvous: an exchange completes when every operation in it is matched, a send by its
// receive posted at the peer and a receive by its send (posted = the peer has reached the
// exchange that holds it); compute never waits. pp_validate runs the lists this way and reports
// a deadlock; pp_simulate times them: compute takes its cost, a message is delivered at
// max(receive posted, send posted + comm), and an exchange ends with its last message.
//
// The bubble, in the lecture's notation: t_f, t_b one stage's forward and backward of one
// micro-batch. Stage s starts s t_f late (the first forward reaches it) and in GPipe and 1F1B
// it ends (p-1-s) t_b before stage 0 (the last backward walking back), idle in between for the
// rest: every stage idles t_pb = (p-1)(t_f + t_b) while it works m (t_f + t_b). The lecture
// (Narayanan et al. 2021) divides t_pb by the ideal time m (t_f + t_b): (p-1)/m. Here the
// bubble is the idle share of the whole step, which is what pp_simulate and the trainer print:
//     bubble = t_pb / (t_pb + m (t_f + t_b)) = (p-1) / (m + p-1)                 gpipe, 1f1b
// (p = 4, m = 8: 3/11 = 0.273 here, 3/8 = 0.375 in the lecture's normalisation.)
// With per chunk costs f, b, w (PPCosts; a whole backward is b + w): t_f = f, t_b = b + w, and
// (p-1)(f+b+w) / (m(f+b+w) + (p-1)(f+b+w)) is the same fraction.
// Interleaved: a stage's work per micro-batch is v chunks, t_f = v f, t_b = v (b + w), but the
// pipeline fills and drains one chunk at a time: t_pb = (p-1)(t_f + t_b) / v (the lecture's
// (1/v)(p-1)/m of the ideal time), so
//     bubble = (p-1)(f+b+w) / (m v (f+b+w) + (p-1)(f+b+w)) = (p-1) / (v m + p-1).
// ZB-H1 (Qi et al. 2023, section 2.1, drawn for f = b = w): the first B reaches stage 0 after
// (p-1)(f + b) instead of (p-1)(f + b + w), and the W's that 1F1B leaves to the end fill the
// tail, so each stage idles t_pb = (p-1)(f + b - w):
//     bubble = (p-1)(f+b-w) / (m(f+b+w) + (p-1)(f+b-w)),   f = b = w: (p-1) / (3m + p-1),
// a third of 1F1B's idle time. Assumes m >= p and w <= f + b; for this schedule it is exact
// when m >= p and w <= min(f, b) (the test checks five such costs); a W longer than f or b no
// longer fits the gaps and the simulation, the reference, shows more; with m < p so does it.
//
// Memory: peak in flight = micro-batches whose activations a stage holds at once, +1 at F,
// -1 where they are freed (B, or W when split). gpipe m; 1f1b min(p-s, m); interleaved
// min(w + 1, m v) chunk activations on stage s; zb-h1 min(p, m) on every stage, of which
// min(p-s, m) are held whole (F to B, as 1F1B's) and the rest only for their W (the paper
// counts those smaller: W needs the layers' inputs and output gradients, not all activations;
// the executor, llmc/parallel/pp.h, keeps a whole slot until W, plus the output gradients).
//
// Cost: building and validating O(v m p) per stage (the pair check walks the lists p times);
// the simulator's fixed point is O(actions + rounds x p), a millisecond at p = 8, m = 64.
#pragma once

#include <stdio.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
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

// one chunk's forward, backward-input, backward-weight, one message's latency; for
// split_backward 0 a PP_B costs b + w
typedef struct { double f, b, w, comm; } PPCosts;

// message tags: m <= PP_MAX_MICRO, v * p <= PP_MAX_CHUNKS keep every tag below 32767 (MPI's
// smallest allowed MPI_TAG_UB)
#define PP_MAX_MICRO 64
#define PP_MAX_CHUNKS 128

static inline const char* pp_schedule_name(int kind) {
    switch (kind) {
        case PP_GPIPE: return "gpipe";
        case PP_1F1B: return "1f1b";
        case PP_INTERLEAVED: return "interleaved";
        case PP_ZBH1: return "zb-h1";
    }
    return "unknown";
}

// -1 if unknown
static inline int pp_schedule_parse(const char* s) {
    for (int k = 0; k < PP_NUM_SCHEDULES; k++) {
        if (s != NULL && strcmp(s, pp_schedule_name(k)) == 0) { return k; }
    }
    return -1;
}

__attribute__((format(printf, 1, 2)))
static inline std::string pp_fmt(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return std::string(buf);
}

// "" when the schedule exists, else one sentence: the problem and the fix
static inline std::string pp_schedule_check(int kind, int p, int m, int v) {
    if (kind < 0 || kind >= PP_NUM_SCHEDULES) {
        return pp_fmt("unknown pipeline schedule %d: use gpipe, 1f1b, interleaved or zb-h1", kind);
    }
    const char* name = pp_schedule_name(kind);
    if (p < 1) { return pp_fmt("%s needs p >= 1 pipeline stages, got %d", name, p); }
    if (m < 1) { return pp_fmt("%s needs m >= 1 micro-batches, got %d", name, m); }
    if (v < 1) { return pp_fmt("%s needs v >= 1 chunks per stage, got %d", name, v); }
    if (m > PP_MAX_MICRO) {
        return pp_fmt("%s: m = %d micro-batches is more than the %d the message tags allow; use fewer, larger micro-batches",
                      name, m, PP_MAX_MICRO);
    }
    if (v * p > PP_MAX_CHUNKS) {
        return pp_fmt("%s: v x p = %d x %d = %d model chunks is more than the %d the message tags allow; use fewer chunks",
                      name, v, p, v * p, PP_MAX_CHUNKS);
    }
    if (kind != PP_INTERLEAVED && v != 1) {
        return pp_fmt("%s runs one model chunk per stage, got v = %d: use v = 1, or the interleaved schedule for v >= 2",
                      name, v);
    }
    if (kind == PP_INTERLEAVED) {
        if (v < 2) { return pp_fmt("interleaved needs v >= 2 model chunks per stage, got %d: use 1f1b for v = 1", v); }
        if (p < 2) { return "interleaved needs p >= 2 stages (on one stage there is no bubble to shrink): use 1f1b"; }
        if (m % p != 0) {
            if (m < p) {
                return pp_fmt("interleaved runs micro-batches in groups of p: m = %d is fewer than p = %d; use m = %d (or a multiple)",
                              m, p, p);
            }
            return pp_fmt("interleaved runs micro-batches in groups of p: m = %d is not a multiple of p = %d; use m = %d or %d",
                          m, p, m / p * p, (m / p + 1) * p);
        }
    }
    return "";
}

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

// index one past the run of communication actions starting at i (one exchange); i itself if
// list[i] is a compute action or i is the end
static inline int pp_exchange_end(const std::vector<PPAction>& list, int i) {
    int j = i;
    while (j < (int)list.size() && pp_is_comm(list[j].kind)) { j++; }
    return j;
}

// ---- building

static inline void pp_push(std::vector<PPAction>& list, int kind, int micro, int chunk, int peer) {
    PPAction a = {kind, micro, chunk, peer};
    list.push_back(a);
}

// interleaved: the micro-batch of a stage's k-th forward (or backward): groups of p
// micro-batches, each group through the v chunks in turn
static inline int pp_interleaved_micro(int k, int p, int v) { return (k / (p * v)) * p + k % p; }

// stage s's compute actions in order (no communication yet), cut into steps: the exchange
// between two steps sends what the first produced and receives what the second needs. Every
// action is a step of its own, except interleaved's steady state, where one step is a pair
// F B (below)
static inline std::vector<std::vector<PPAction>> pp_compute_steps(int kind, int p, int m, int v, int s) {
    std::vector<PPAction> o;
    std::vector<std::vector<PPAction>> steps;
    if (kind == PP_GPIPE) {
        for (int i = 0; i < m; i++) { pp_push(o, PP_F, i, 0, -1); }
        for (int i = m - 1; i >= 0; i--) { pp_push(o, PP_B, i, 0, -1); }
    } else if (kind == PP_1F1B || kind == PP_ZBH1) {
        int w = std::min(p - s - 1, m);
        for (int i = 0; i < w; i++) { pp_push(o, PP_F, i, 0, -1); }
        for (int i = 0; i < m - w; i++) {
            pp_push(o, PP_F, w + i, 0, -1);
            pp_push(o, PP_B, i, 0, -1);
        }
        for (int i = m - w; i < m; i++) { pp_push(o, PP_B, i, 0, -1); }
        if (kind == PP_ZBH1) {
            // W(i) right after B(i + s), the last s W's at the end
            std::vector<PPAction> z;
            for (const PPAction& a : o) {
                z.push_back(a);
                if (a.kind == PP_B && a.micro - s >= 0) { pp_push(z, PP_W, a.micro - s, 0, -1); }
            }
            for (int i = std::max(0, m - s); i < m; i++) { pp_push(z, PP_W, i, 0, -1); }
            o = z;
        }
    } else if (kind == PP_INTERLEAVED) {
        // Megatron's steps: each warm-up F, the steady pairs F B (no exchange between them: see
        // "Communication" above), each cool-down B
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
    }
    for (const PPAction& a : o) { steps.push_back(std::vector<PPAction>(1, a)); }
    return steps;
}

// ZB-H1's communication. Placed as the other schedules' (a receive just before its compute, a
// send just after), rendezvous exchanges would stall: a stage that finished B(i) early waits
// in the send until its predecessor, busy with W's and F's, reaches its receive (p = 4, m = 8:
// 33 time units instead of 27). So each message is placed at one moment on both ends: the
// moment its consumer starts in the schedule's own timeline with F = B = W = 1 (data
// dependencies only). The receive stays just before its compute (perhaps after some idle
// time), the send moves after the producer to that moment (between two of the sender's
// computes, often joining the exchange of its own next receive). With equal costs no exchange
// ever waits; with other costs the order still holds and the simulator shows the stalls.
static inline void pp_place_comm_timed(PPSchedule& sc) {
    int p = sc.p, m = sc.m, G = sc.v * p, last = G - 1;
    // the unit-cost timeline: each compute starts when the previous one on its stage and the
    // one that produces its input have ended
    std::vector<int> endF(m * G, -1), endB(m * G, -1), startF(m * G, -1), startB(m * G, -1);
    std::vector<std::vector<int>> t0(p);
    std::vector<int> pos(p, 0), t(p, 0);
    for (int s = 0; s < p; s++) { t0[s].assign(sc.stages[s].size(), 0); }
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < p; s++) {
            while (pos[s] < (int)sc.stages[s].size()) {
                const PPAction& a = sc.stages[s][pos[s]];
                int g = a.chunk * p + s, x = a.micro * G + g;
                int input = -2;   // when its input was produced; -1 not yet, -2 needs none
                if (a.kind == PP_F && g > 0) { input = endF[x - 1]; }
                if (a.kind == PP_B && g < last) { input = endB[x + 1]; }
                if (input == -1) { break; }
                t0[s][pos[s]] = std::max(t[s], input);
                t[s] = t0[s][pos[s]] + 1;
                if (a.kind == PP_F) { startF[x] = t0[s][pos[s]]; endF[x] = t[s]; }
                if (a.kind == PP_B) { startB[x] = t0[s][pos[s]]; endB[x] = t[s]; }
                pos[s]++;
                progress = 1;
            }
        }
    }
    // every message at its consumer's start, on both ends
    typedef struct { int when, tag; PPAction a; } Timed;
    std::vector<std::vector<Timed>> comm(p);
    for (int s = 0; s < p; s++) {
        for (const PPAction& a : sc.stages[s]) {
            int g = a.chunk * p + s, x = a.micro * G + g;
            if (a.kind == PP_F && g < last) {
                int to = (g + 1) % p, tag = pp_message_tag(0, a.micro, g);
                Timed snd = {startF[x + 1], tag, {PP_SEND_ACT, a.micro, a.chunk, to}};
                Timed rcv = {startF[x + 1], tag, {PP_RECV_ACT, a.micro, (g + 1) / p, s}};
                comm[s].push_back(snd);
                comm[to].push_back(rcv);
            }
            if (a.kind == PP_B && g > 0) {
                int to = (g - 1) % p, tag = pp_message_tag(1, a.micro, g);
                Timed snd = {startB[x - 1], tag, {PP_SEND_GRAD, a.micro, a.chunk, to}};
                Timed rcv = {startB[x - 1], tag, {PP_RECV_GRAD, a.micro, (g - 1) / p, s}};
                comm[s].push_back(snd);
                comm[to].push_back(rcv);
            }
        }
    }
    // merged into each stage's computes: the messages of moment T before the first compute that
    // starts at T or later; in the same order (moment, tag) on both ends of every pair
    for (int s = 0; s < p; s++) {
        std::sort(comm[s].begin(), comm[s].end(),
                  [](const Timed& x, const Timed& y) { return x.when != y.when ? x.when < y.when : x.tag < y.tag; });
        std::vector<PPAction> list;
        size_t k = 0;
        for (int i = 0; i <= (int)sc.stages[s].size(); i++) {
            int next = i < (int)sc.stages[s].size() ? t0[s][i] : INT32_MAX;
            for (; k < comm[s].size() && comm[s][k].when <= next; k++) { list.push_back(comm[s][k].a); }
            if (i < (int)sc.stages[s].size()) { list.push_back(sc.stages[s][i]); }
        }
        sc.stages[s] = list;
    }
}

// the schedule: compute steps, the receives of a step's inputs before it and the sends of its
// outputs after it (ZB-H1: pp_place_comm_timed)
static inline PPSchedule pp_build(int kind, int p, int m, int v) {
    std::string why = pp_schedule_check(kind, p, m, v);
    if (!why.empty()) { die("%s", why.c_str()); }
    PPSchedule sc;
    sc.kind = kind;
    sc.p = p;
    sc.m = m;
    sc.v = v;
    sc.split_backward = kind == PP_ZBH1;
    sc.stages.resize(p);
    int last = v * p - 1;   // the global chunk with the loss
    int timed = kind == PP_ZBH1;
    for (int s = 0; s < p; s++) {
        std::vector<PPAction>& list = sc.stages[s];
        for (const std::vector<PPAction>& step : pp_compute_steps(kind, p, m, v, s)) {
            for (const PPAction& a : step) {
                int g = a.chunk * p + s;
                if (!timed && a.kind == PP_F && g > 0) { pp_push(list, PP_RECV_ACT, a.micro, a.chunk, (g - 1) % p); }
                if (!timed && a.kind == PP_B && g < last) { pp_push(list, PP_RECV_GRAD, a.micro, a.chunk, (g + 1) % p); }
            }
            for (const PPAction& a : step) { list.push_back(a); }
            for (const PPAction& a : step) {
                int g = a.chunk * p + s;
                if (!timed && a.kind == PP_F && g < last) { pp_push(list, PP_SEND_ACT, a.micro, a.chunk, (g + 1) % p); }
                if (!timed && a.kind == PP_B && g > 0) { pp_push(list, PP_SEND_GRAD, a.micro, a.chunk, (g - 1) % p); }
            }
        }
    }
    if (timed) { pp_place_comm_timed(sc); }
    for (int s = 0; s < p; s++) {
        std::vector<PPAction>& list = sc.stages[s];
        // within each exchange, the sends first (stable: their order is kept)
        for (int i = 0; i < (int)list.size();) {
            int j = pp_exchange_end(list, i);
            if (j == i) { i++; continue; }
            std::stable_partition(list.begin() + i, list.begin() + j, [](const PPAction& a) { return pp_is_send(a.kind) != 0; });
            i = j;
        }
    }
    return sc;
}

// ---- text

// F3, B12, W0: upper case for even chunks, lower case for odd ones (the lecture's dark and
// light colours), and ":c" for the chunk when v > 2
static inline std::string pp_compute_label(const PPSchedule& s, const PPAction& a) {
    const char* letters = a.chunk % 2 == 0 ? "FBW" : "fbw";
    std::string l = pp_fmt("%c%d", letters[a.kind], a.micro);
    if (s.v > 2) { l += pp_fmt(":%d", a.chunk); }
    return l;
}

// "F3", "send a3>2" (activation of micro-batch 3 to stage 2), "recv g3<2" (gradient from stage 2);
// with v > 1 the local chunk follows the micro-batch: "recv a3:1<0"
static inline std::string pp_action_label(const PPSchedule& s, const PPAction& a) {
    if (!pp_is_comm(a.kind)) { return pp_compute_label(s, a); }
    std::string what = pp_fmt("%c%d", pp_is_grad(a.kind) ? 'g' : 'a', a.micro);
    if (s.v > 1) { what += pp_fmt(":%d", a.chunk); }
    return pp_fmt("%s %s%c%d", pp_is_send(a.kind) ? "send" : "recv", what.c_str(), pp_is_send(a.kind) ? '>' : '<', a.peer);
}

// a message in words, from its tag: "the activation of micro-batch 3 from global chunk 2"
static inline std::string pp_tag_words(int tag) {
    int micro = tag % PP_MAX_MICRO, g = tag / PP_MAX_MICRO % PP_MAX_CHUNKS, is_grad = tag / (PP_MAX_MICRO * PP_MAX_CHUNKS);
    return pp_fmt("the %s of micro-batch %d from global chunk %d", is_grad ? "gradient" : "activation", micro, g);
}

// each stage's list, one line per stage, an exchange in brackets:
//   stage 1: [recv a0<0] F0 [send a0>2 recv a1<0] F1 ...
static inline void pp_print_lists(FILE* out, const PPSchedule& s) {
    fprintf(out, "%s p %d m %d v %d: each stage's actions in order; [ ] is one exchange (sends and receives posted together)\n",
            pp_schedule_name(s.kind), s.p, s.m, s.v);
    for (int st = 0; st < (int)s.stages.size(); st++) {
        const std::vector<PPAction>& list = s.stages[st];
        fprintf(out, "stage %d:", st);
        for (int i = 0; i < (int)list.size();) {
            int j = pp_exchange_end(list, i);
            if (j == i) {
                fprintf(out, " %s", pp_action_label(s, list[i]).c_str());
                i++;
                continue;
            }
            fprintf(out, " [");
            for (int k = i; k < j; k++) { fprintf(out, "%s%s", k > i ? " " : "", pp_action_label(s, list[k]).c_str()); }
            fprintf(out, "]");
            i = j;
        }
        fprintf(out, "\n");
    }
}

// ---- running the lists: rendezvous exchanges, compute never waits

typedef struct {
    std::vector<std::vector<double>> start, end;   // [stage][action]; comm actions get their exchange's times
    double makespan;                               // the last action's end (everything starts at 0)
    std::vector<double> busy;                      // [stage] compute time
    double bubble;                                 // 1 - sum(busy) / (p * makespan)
    std::vector<int> peak_inflight;                // [stage] most chunk activations alive at once
} PPSim;

// for each communication action, its partner's (stage, index): the k-th send from a to b
// matches the k-th receive at b from a (NCCL's rule); -1 where there is none
static inline void pp_partners(const PPSchedule& s, std::vector<std::vector<int>>& pstage,
                               std::vector<std::vector<int>>& pindex) {
    int p = s.p;
    pstage.assign(p, std::vector<int>());
    pindex.assign(p, std::vector<int>());
    for (int a = 0; a < p; a++) {
        pstage[a].assign(s.stages[a].size(), -1);
        pindex[a].assign(s.stages[a].size(), -1);
    }
    for (int a = 0; a < p; a++) {
        for (int b = 0; b < p; b++) {
            std::vector<int> sends, recvs;
            for (int i = 0; i < (int)s.stages[a].size(); i++) {
                const PPAction& x = s.stages[a][i];
                if (pp_is_send(x.kind) && x.peer == b) { sends.push_back(i); }
            }
            for (int i = 0; i < (int)s.stages[b].size(); i++) {
                const PPAction& x = s.stages[b][i];
                if (pp_is_comm(x.kind) && !pp_is_send(x.kind) && x.peer == a) { recvs.push_back(i); }
            }
            for (int k = 0; k < (int)std::min(sends.size(), recvs.size()); k++) {
                pstage[a][sends[k]] = b;
                pindex[a][sends[k]] = recvs[k];
                pstage[b][recvs[k]] = a;
                pindex[b][recvs[k]] = sends[k];
            }
        }
    }
}

static inline double pp_compute_cost(const PPSchedule& s, const PPCosts& c, int kind) {
    if (kind == PP_F) { return c.f; }
    if (kind == PP_B) { return s.split_backward ? c.b : c.b + c.w; }
    return c.w;
}

// Runs the lists to the end or to a fixed point. Each stage advances through compute actions
// (cost) and stops at an exchange until all its messages are matched. Returns 1 when every
// stage finished; else 0 and, in *stuck, every stuck stage's unmatched operations.
// (The costs come by reference: passed by value, the trainer built with GCC 12.2 -O2 -march=native
// on an AVX-512 machine read comm as 1 instead of 0 in some calls (measured: every bubble came
// out as with --comm 1; right at -O1, with -mno-avx512f and with a printf added). test_pp.sh
// checks the trainer's printed bubble against the formula, so a relapse shows.)
static inline int pp_run(const PPSchedule& s, const PPCosts& c, PPSim* sim, std::string* stuck) {
    int p = s.p;
    std::vector<std::vector<int>> pstage, pindex;
    pp_partners(s, pstage, pindex);
    PPSim r;
    r.start.assign(p, std::vector<double>());
    r.end.assign(p, std::vector<double>());
    std::vector<std::vector<double>> posted(p);   // when the action's exchange was posted, -1 before
    for (int st = 0; st < p; st++) {
        r.start[st].assign(s.stages[st].size(), 0.0);
        r.end[st].assign(s.stages[st].size(), 0.0);
        posted[st].assign(s.stages[st].size(), -1.0);
    }
    r.busy.assign(p, 0.0);
    r.peak_inflight.assign(p, 0);
    std::vector<int> pos(p, 0), alive(p, 0);
    std::vector<double> t(p, 0.0);
    int free_kind = s.split_backward ? PP_W : PP_B;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int st = 0; st < p; st++) {
            const std::vector<PPAction>& list = s.stages[st];
            while (pos[st] < (int)list.size()) {
                int i = pos[st];
                const PPAction& a = list[i];
                if (!pp_is_comm(a.kind)) {
                    double d = pp_compute_cost(s, c, a.kind);
                    r.start[st][i] = t[st];
                    r.end[st][i] = t[st] + d;
                    t[st] += d;
                    r.busy[st] += d;
                    if (a.kind == PP_F) { alive[st]++; }
                    if (a.kind == free_kind) { alive[st]--; }
                    r.peak_inflight[st] = std::max(r.peak_inflight[st], alive[st]);
                    pos[st]++;
                    progress = 1;
                    continue;
                }
                int j = pp_exchange_end(list, i);
                if (posted[st][i] < 0) {
                    for (int k = i; k < j; k++) { posted[st][k] = t[st]; }
                    progress = 1;
                }
                double done = t[st];
                int ready = 1;
                for (int k = i; k < j && ready; k++) {
                    int ps = pstage[st][k], pi = pindex[st][k];
                    if (ps < 0 || posted[ps][pi] < 0) { ready = 0; break; }
                    double send_posted = pp_is_send(list[k].kind) ? posted[st][k] : posted[ps][pi];
                    double recv_posted = pp_is_send(list[k].kind) ? posted[ps][pi] : posted[st][k];
                    done = std::max(done, std::max(recv_posted, send_posted + c.comm));
                }
                if (!ready) { break; }
                for (int k = i; k < j; k++) {
                    r.start[st][k] = t[st];
                    r.end[st][k] = done;
                }
                t[st] = done;
                pos[st] = j;
                progress = 1;
            }
        }
    }
    int finished = 1;
    std::string why;
    for (int st = 0; st < p; st++) {
        const std::vector<PPAction>& list = s.stages[st];
        if (pos[st] >= (int)list.size()) { continue; }
        finished = 0;
        int i = pos[st], j = pp_exchange_end(list, i);
        why += pp_fmt("%sstage %d waits in [", why.empty() ? "" : ", ", st);
        int first = 1;
        for (int k = i; k < j; k++) {
            int ps = pstage[st][k], pi = pindex[st][k];
            if (ps >= 0 && posted[ps][pi] >= 0) { continue; }
            why += pp_fmt("%s%s", first ? "" : " ", pp_action_label(s, list[k]).c_str());
            first = 0;
        }
        why += "]";
    }
    if (stuck != NULL) { *stuck = why; }
    r.makespan = 0.0;
    for (int st = 0; st < p; st++) { r.makespan = std::max(r.makespan, t[st]); }
    double work = 0.0;
    for (int st = 0; st < p; st++) { work += r.busy[st]; }
    r.bubble = r.makespan > 0 ? 1.0 - work / (p * r.makespan) : 0.0;
    if (sim != NULL) { *sim = r; }
    return finished;
}

// ---- checking

// "" or the first problem found: counts and order of the compute actions, every message
// matched and in the same order on both ends, receives before and sends after their compute,
// and no deadlock when run with rendezvous exchanges
static inline std::string pp_validate(const PPSchedule& s) {
    int p = s.p, m = s.m, v = s.v, last = v * p - 1;
    if (p < 1 || m < 1 || v < 1 || (int)s.stages.size() != p) {
        return pp_fmt("the schedule has %d stage lists for p = %d (m = %d, v = %d)", (int)s.stages.size(), p, m, v);
    }
    // 1. every action's fields, and the peer a message must go to
    for (int st = 0; st < p; st++) {
        for (int i = 0; i < (int)s.stages[st].size(); i++) {
            const PPAction& a = s.stages[st][i];
            if (a.kind < PP_F || a.kind > PP_RECV_GRAD || a.micro < 0 || a.micro >= m || a.chunk < 0 || a.chunk >= v) {
                return pp_fmt("stage %d, action %d: kind %d, micro-batch %d, chunk %d out of range (m = %d, v = %d)", st, i,
                              a.kind, a.micro, a.chunk, m, v);
            }
            std::string l = pp_action_label(s, a);
            if (!pp_is_comm(a.kind)) {
                if (a.peer != -1) { return pp_fmt("stage %d: compute action %s has peer %d, not -1", st, l.c_str(), a.peer); }
                if (a.kind == PP_W && !s.split_backward) {
                    return pp_fmt("stage %d: %s, but this schedule does not split the backward", st, l.c_str());
                }
                continue;
            }
            int g = a.chunk * p + st, want = -1;
            if (a.kind == PP_SEND_ACT || a.kind == PP_RECV_GRAD) { want = g < last ? (g + 1) % p : -1; }
            if (a.kind == PP_RECV_ACT || a.kind == PP_SEND_GRAD) { want = g > 0 ? (g - 1) % p : -1; }
            if (want < 0) {
                return pp_fmt("stage %d: %s, but global chunk %d is the %s chunk: there is no such message", st, l.c_str(), g,
                              g == 0 ? "first" : "last");
            }
            if (a.peer != want) {
                int other = (a.kind == PP_SEND_ACT || a.kind == PP_RECV_GRAD) ? g + 1 : g - 1;
                return pp_fmt("stage %d: %s, but that message is between global chunks %d and %d, on stages %d and %d", st,
                              l.c_str(), g, other, st, want);
            }
        }
    }
    // 2. each (micro-batch, chunk): one F, one B, one W when split; F before B before W
    for (int st = 0; st < p; st++) {
        std::vector<int> at[3], count[3];
        for (int k = 0; k < 3; k++) {
            at[k].assign(m * v, -1);
            count[k].assign(m * v, 0);
        }
        for (int i = 0; i < (int)s.stages[st].size(); i++) {
            const PPAction& a = s.stages[st][i];
            if (pp_is_comm(a.kind)) { continue; }
            count[a.kind][a.micro * v + a.chunk]++;
            if (at[a.kind][a.micro * v + a.chunk] < 0) { at[a.kind][a.micro * v + a.chunk] = i; }
        }
        for (int i = 0; i < m; i++) {
            for (int ch = 0; ch < v; ch++) {
                int x = i * v + ch;
                PPAction f = {PP_F, i, ch, -1}, b = {PP_B, i, ch, -1}, w = {PP_W, i, ch, -1};
                std::string lf = pp_compute_label(s, f), lb = pp_compute_label(s, b), lw = pp_compute_label(s, w);
                int nw = s.split_backward ? 1 : 0;
                if (count[PP_F][x] != 1 || count[PP_B][x] != 1 || count[PP_W][x] != nw) {
                    return pp_fmt("stage %d runs micro-batch %d of local chunk %d's F %d times, B %d times, W %d times "
                                  "(want 1, 1, %d)", st, i, ch, count[PP_F][x], count[PP_B][x], count[PP_W][x], nw);
                }
                if (at[PP_B][x] < at[PP_F][x]) {
                    return pp_fmt("stage %d: %s (action %d) comes before its forward %s (action %d)", st, lb.c_str(), at[PP_B][x],
                                  lf.c_str(), at[PP_F][x]);
                }
                if (nw && at[PP_W][x] < at[PP_B][x]) {
                    return pp_fmt("stage %d: %s (action %d) comes before its backward %s (action %d)", st, lw.c_str(), at[PP_W][x],
                                  lb.c_str(), at[PP_B][x]);
                }
            }
        }
    }
    // 3. for every ordered pair of stages: the same messages sent and received, in the same order
    for (int a = 0; a < p; a++) {
        for (int b = 0; b < p; b++) {
            std::vector<int> sent, received;
            for (const PPAction& x : s.stages[a]) {
                if (pp_is_send(x.kind) && x.peer == b) { sent.push_back(pp_message_tag(pp_is_grad(x.kind), x.micro, pp_sender_chunk(s, a, x))); }
            }
            for (const PPAction& x : s.stages[b]) {
                if (pp_is_comm(x.kind) && !pp_is_send(x.kind) && x.peer == a) {
                    received.push_back(pp_message_tag(pp_is_grad(x.kind), x.micro, pp_sender_chunk(s, b, x)));
                }
            }
            std::vector<int> ss = sent, rr = received;
            std::sort(ss.begin(), ss.end());
            std::sort(rr.begin(), rr.end());
            for (size_t i = 0, k = 0; i < ss.size() || k < rr.size(); i++, k++) {
                if (k >= rr.size() || (i < ss.size() && ss[i] < rr[k])) {
                    return pp_fmt("stage %d sends %s to stage %d, which has no matching receive", a,
                                  pp_tag_words(ss[i]).c_str(), b);
                }
                if (i >= ss.size() || rr[k] < ss[i]) {
                    return pp_fmt("stage %d receives %s from stage %d, which never sends it", b, pp_tag_words(rr[k]).c_str(),
                                  a);
                }
            }
            for (size_t n = 0; n < sent.size(); n++) {
                if (sent[n] != received[n]) {
                    return pp_fmt("stage %d sends to stage %d in another order than stage %d receives: its message %d is %s, "
                                  "but receive %d expects %s (NCCL matches messages by order)", a, b, b, (int)n,
                                  pp_tag_words(sent[n]).c_str(), (int)n, pp_tag_words(received[n]).c_str());
                }
            }
        }
    }
    // 4. a receive before the compute that needs it, a send after the compute that produces
    //    it: first every stage's receives, then its sends
    for (int pass = 0; pass < 2; pass++) {
        for (int st = 0; st < p; st++) {
            const std::vector<PPAction>& list = s.stages[st];
            // per (comm kind, micro-batch, chunk): how many, and where the last one is
            std::vector<int> n(4 * m * v, 0), at(4 * m * v, -1);
            for (int k = 0; k < (int)list.size(); k++) {
                if (!pp_is_comm(list[k].kind)) { continue; }
                int x = ((list[k].kind - PP_SEND_ACT) * m + list[k].micro) * v + list[k].chunk;
                n[x]++;
                at[x] = k;
            }
            for (int i = 0; i < (int)list.size(); i++) {
                const PPAction& c = list[i];
                if (c.kind != PP_F && c.kind != PP_B) { continue; }
                int g = c.chunk * p + st, fwd = c.kind == PP_F;
                if (pass == 0 ? (fwd ? g == 0 : g == last) : (fwd ? g == last : g == 0)) { continue; }   // no such message
                int want = pass == 0 ? (fwd ? PP_RECV_ACT : PP_RECV_GRAD) : (fwd ? PP_SEND_ACT : PP_SEND_GRAD);
                int x = ((want - PP_SEND_ACT) * m + c.micro) * v + c.chunk;
                int peer = (pass == 0) == fwd ? (g - 1) % p : (g + 1) % p;
                std::string l = pp_compute_label(s, c);
                const char* what = fwd ? "activation" : "gradient";
                if (n[x] != 1) {
                    return pp_fmt("stage %d: %s has %d %s of its %s %s %s stage %d (want 1)", st, l.c_str(), n[x],
                                  pass == 0 ? "receives" : "sends", pass == 0 ? "input" : "output", what,
                                  pass == 0 ? "from" : "to", peer);
                }
                if (pass == 0 && at[x] > i) {
                    return pp_fmt("stage %d: the receive of %s's input %s (action %d) comes after %s (action %d)", st, l.c_str(),
                                  what, at[x], l.c_str(), i);
                }
                if (pass == 1 && at[x] < i) {
                    return pp_fmt("stage %d: %s's output %s is sent (action %d) before %s computes it (action %d)", st, l.c_str(),
                                  what, at[x], l.c_str(), i);
                }
            }
        }
    }
    // 5. runs to the end with rendezvous exchanges
    std::string stuck;
    if (!pp_run(s, PPCosts{1.0, 1.0, 1.0, 0.0}, NULL, &stuck)) {
        return "deadlock (an exchange completes only when the peers have posted the matching operations): " + stuck;
    }
    return "";
}

// ---- timing

// Times the lists (validate them first: a deadlock stops the program here).
static inline PPSim pp_simulate(const PPSchedule& s, const PPCosts& c) {
    PPSim r;
    std::string stuck;
    if (!pp_run(s, c, &r, &stuck)) { die("pp_simulate: %s p %d m %d v %d deadlocks: %s", pp_schedule_name(s.kind), s.p, s.m, s.v, stuck.c_str()); }
    return r;
}

// peak of (F's minus the actions of kind free_kind) over each stage's list
static inline std::vector<int> pp_peak_inflight_until(const PPSchedule& s, int free_kind) {
    std::vector<int> peak(s.stages.size(), 0);
    for (int st = 0; st < (int)s.stages.size(); st++) {
        int alive = 0;
        for (const PPAction& a : s.stages[st]) {
            if (a.kind == PP_F) { alive++; }
            if (a.kind == free_kind) { alive--; }
            peak[st] = std::max(peak[st], alive);
        }
    }
    return peak;
}

// the simulator's peak_inflight, from the lists alone: activations live from F to B, or to W
// when the backward is split
static inline std::vector<int> pp_peak_inflight(const PPSchedule& s) {
    return pp_peak_inflight_until(s, s.split_backward ? PP_W : PP_B);
}

// the bubble fraction from the formulas of the header comment (per chunk costs; c.comm is not
// in them). ZB-H1's holds for m >= p and w <= min(f, b) (header); f + b - w is taken as 0 below 0.
static inline double pp_formula_bubble(int kind, int p, int m, int v, PPCosts c) {
    double full = c.f + c.b + c.w;          // one chunk's forward and whole backward
    double tpb = (p - 1) * full, work = m * full;
    if (kind == PP_INTERLEAVED) { work = (double)v * m * full; }
    if (kind == PP_ZBH1) { tpb = (p - 1) * std::max(c.f + c.b - c.w, 0.0); }
    return tpb + work > 0 ? tpb / (tpb + work) : 0.0;
}

// ---- the picture

// One row per stage, time to the right: each compute action a cell as wide as its duration
// (the time unit = the smallest compute duration, one unit = the widest label + 1 characters),
// labelled F/B/W + micro-batch (pp_compute_label), "-" where a long cell continues, "." idle.
// Rows longer than 180 characters are cut into blocks of whole units, printed one under the
// other. Then a footer: makespan, bubble simulated vs formula, peak in-flight per stage.
static inline void pp_print_timeline(FILE* out, const PPSchedule& s, const PPSim& sim) {
    int p = s.p;
    double unit = 0.0;
    int label = 2;
    for (int st = 0; st < p; st++) {
        for (int i = 0; i < (int)s.stages[st].size(); i++) {
            const PPAction& a = s.stages[st][i];
            if (pp_is_comm(a.kind)) { continue; }
            double d = sim.end[st][i] - sim.start[st][i];
            if (d > 0 && (unit == 0.0 || d < unit)) { unit = d; }
            label = std::max(label, (int)pp_compute_label(s, a).size());
        }
    }
    if (unit == 0.0) { unit = 1.0; }
    int cw = label + 1;   // characters per time unit
    int cols = (int)floor(sim.makespan / unit * cw + 0.5);
    std::vector<std::string> rows(p, std::string(cols, '.'));
    for (int st = 0; st < p; st++) {
        for (int i = 0; i < (int)s.stages[st].size(); i++) {
            const PPAction& a = s.stages[st][i];
            if (pp_is_comm(a.kind)) { continue; }
            int c0 = (int)floor(sim.start[st][i] / unit * cw + 0.5), c1 = (int)floor(sim.end[st][i] / unit * cw + 0.5);
            if (c1 <= c0) { continue; }   // zero cost: not drawn
            std::string l = pp_compute_label(s, a);
            int room = c1 - c0 > 1 ? c1 - c0 - 1 : 1;   // keep a blank after the cell
            for (int c = c0; c < c1; c++) {
                int k = c - c0;
                rows[st][c] = k < (int)l.size() && k < room ? l[k] : (c == c1 - 1 ? ' ' : '-');
            }
        }
    }
    const int width = std::max(cw, 180 / cw * cw);
    fprintf(out, "%s  p %d  m %d  v %d: time flows right, a time unit (%g) is %d characters; F/B%s + micro-batch, "
            "upper case chunk 0%s%s; '-' the cell goes on; '.' idle%s\n", pp_schedule_name(s.kind), p, s.m, s.v, unit, cw,
            s.split_backward ? "/W (B the input gradient, W the weight gradient)" : " (B the whole backward)",
            s.v > 1 ? ", lower case chunk 1" : "", s.v > 2 ? ", :c chunk c" : "",
            cols > width ? pp_fmt("; rows cut every %d characters", width).c_str() : "");
    for (int c0 = 0; c0 < cols || c0 == 0; c0 += width) {
        if (c0 > 0) { fprintf(out, "\n"); }
        for (int st = 0; st < p; st++) {
            std::string piece = rows[st].substr(c0, width);
            while (!piece.empty() && piece.back() == ' ') { piece.pop_back(); }
            fprintf(out, "stage %-2d|%s\n", st, piece.c_str());
        }
        if (cols == 0) { break; }
    }
    // the formula with the costs read off the picture: the durations of the first F, B and W
    PPCosts c = {0, 0, 0, 0};
    for (int i = 0; i < (int)s.stages[0].size(); i++) {
        const PPAction& a = s.stages[0][i];
        double d = sim.end[0][i] - sim.start[0][i];
        if (a.kind == PP_F && c.f == 0) { c.f = d; }
        if (a.kind == PP_B && c.b == 0) { c.b = d; }
        if (a.kind == PP_W && c.w == 0) { c.w = d; }
    }
    fprintf(out, "makespan %g, bubble %.2f%% simulated, %.2f%% formula; peak in flight per stage:", sim.makespan,
            100.0 * sim.bubble, 100.0 * pp_formula_bubble(s.kind, p, s.m, s.v, c));
    for (int st = 0; st < p; st++) { fprintf(out, " %d", sim.peak_inflight[st]); }
    fprintf(out, "\n");
}
