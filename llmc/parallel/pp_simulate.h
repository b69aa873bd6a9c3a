// The accounting of a pipeline schedule on paper: its timing and its bubble. pp_run plays the
// lists (pp_1f1b.h) with a cost per action and per message; pp_simulate gives the times, the
// bubble and the peak of micro-batches in flight; pp_formula_bubble is the closed form they are
// checked against (test/test_pp_schedule.cu, and the trainer's report every step).
//
// Rendezvous: an exchange completes when every operation in it is matched, a send by its
// receive posted at the peer and a receive by its send (posted = the peer has reached the
// exchange that holds it); compute never waits. pp_run runs the lists this way and reports a
// deadlock (pp_validate.h relies on it); with costs it times them: compute takes its cost, a
// message is delivered at max(receive posted, send posted + comm), and an exchange ends with
// its last message.
//
// The bubble fraction this code prints is the idle share of the whole step, t_pb / (t_pb +
// t_ideal); the lecture (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM") divides t_pb by the ideal time t_ideal instead: (p-1)/m for
// GPipe and 1F1B (pp_1f1b.h has the picture). With per chunk costs f, b, w (PPCosts; a whole
// backward is b + w), t_f = f and t_b = b + w:
//     bubble = (p-1)(f+b+w) / (m(f+b+w) + (p-1)(f+b+w)) = (p-1) / (m + p-1)          gpipe, 1f1b
//     bubble = (p-1)(f+b+w) / (m v (f+b+w) + (p-1)(f+b+w)) = (p-1) / (v m + p-1)     interleaved
//     bubble = (p-1)(f+b-w) / (m(f+b+w) + (p-1)(f+b-w))                             zb-h1
// (pp_interleaved.h and pp_zbh1.h derive theirs; ZB-H1's holds for m >= p, w <= min(f, b).)
// x the lecture's ratio and y this code's: y = x / (1 + x), x = y / (1 - y).
//
// Memory: peak in flight = micro-batches whose activations a stage holds at once, +1 at F,
// -1 where they are freed (B, or W when split). gpipe m; 1f1b min(p-s, m); interleaved
// min(w + 1, m v) chunk activations on stage s; zb-h1 min(p, m) on every stage.
//
// Cost: the simulator's fixed point is O(actions + rounds x p), a millisecond at p = 8, m = 64.
#pragma once

#include <math.h>
#include "pp_schedule.h"

// one chunk's forward, backward-input, backward-weight, one message's latency; for
// split_backward 0 a PP_B costs b + w
typedef struct { double f, b, w, comm; } PPCosts;

// ---- an action in words (the simulator's deadlock report, the validator, the printed lists)

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

// ---- the formula

// the bubble fraction, the idle share of the step, from the formulas of the header comment (per
// chunk costs; c.comm is not in them). ZB-H1's holds for m >= p and w <= min(f, b) (header); f + b - w is taken as 0 below 0.
static inline double pp_formula_bubble(int kind, int p, int m, int v, PPCosts c) {
    double full = c.f + c.b + c.w;          // one chunk's forward and whole backward
    double tpb = (p - 1) * full, work = m * full;
    if (kind == PP_INTERLEAVED) { work = (double)v * m * full; }
    if (kind == PP_ZBH1) { tpb = (p - 1) * std::max(c.f + c.b - c.w, 0.0); }
    return tpb + work > 0 ? tpb / (tpb + work) : 0.0;
}
