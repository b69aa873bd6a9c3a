// The check of a pipeline schedule (pp_1f1b.h) before anything runs it: every action's
// fields and peer, each (micro-batch, chunk) computed once and in order (F, B, W), every
// message sent and received in the same order on both ends (NCCL matches the messages between
// two ranks by order, not by tag; MPI may match by tag instead: pp_message_tag), a receive
// before the compute that needs it and a send after the one that produces it, and no deadlock
// when the exchanges are rendezvous (pp_run, pp_simulate.h): an exchange then finds its
// partners even when a send waits for its receive (NCCL, or MPI above the eager limit), so no
// ordering of ranks can deadlock.
//
// Cost: O(v m p) per stage (the pair check walks the lists p times).
#pragma once

#include "pp_simulate.h"

// a message in words, from its tag: "the activation of micro-batch 3 from global chunk 2"
static inline std::string pp_tag_words(int tag) {
    int micro = tag % PP_MAX_MICRO, g = tag / PP_MAX_MICRO % PP_MAX_CHUNKS, is_grad = tag / (PP_MAX_MICRO * PP_MAX_CHUNKS);
    return pp_fmt("the %s of micro-batch %d from global chunk %d", is_grad ? "gradient" : "activation", micro, g);
}

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
