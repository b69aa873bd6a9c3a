// The pipeline schedules of llmc/parallel/pp_schedule.h, on paper (host only, well under a
// second): no model, no ranks, only the lists, the validator (pp_validate.h) and the simulator
// (pp_simulate.h).
//   a) every schedule builds and validates (matched messages in order, no deadlock with
//      rendezvous exchanges) for p in {1,2,3,4,8}, m in {1,2,3,4,8,16}, interleaved with v in
//      {2,3,4}; pp_schedule_check refuses exactly interleaved's m % p != 0 and p = 1; in every
//      exchange the sends come first.
//   b) the simulated bubble (the idle share of the step; the lecture's (p-1)/m divides the same
//      idle time by the ideal time instead) equals the formula to 1e-9: gpipe and 1f1b
//      (f,b,w = 1,2,0 and 1,1,1), interleaved (1,2,0; m % p == 0), zb-h1 (1,1,1 and other costs with w <= min(f,b),
//      m >= p); zb-h1's bubble is below 1f1b's for every p >= 2, m; a message's latency is
//      paid once per hop (p = 2, m = 1 by hand).
//   c) peak in flight: gpipe m; 1f1b min(p-s, m); zb-h1 min(p, m) from F to W (1f1b's stage 0)
//      and min(p-s, m) from F to B (1f1b's); interleaved stage 0 Megatron's warm-up + 1 (at
//      most m v); the static count equals the simulator's everywhere.
//   d) pp_validate rejects hand-broken lists with a message naming the problem: a B before its
//      F, a missing receive, a send with no receive, a receive after its compute, two sends in
//      swapped order, a deadlock, a missing W.
//   e) pp_schedule_check's refusals and the names; message tags unique and below 32767 at the
//      largest schedule allowed (m = 64, v p = 128).
//   f) zb-h1's lists for the executor: a receive right before its compute, a send after its
//      producer with only W's between.
// Prints PASS/FAIL per check; exits 1 if any failed.
#include <vector>
#include <string>
#include "../llmc/common.h"
#include "../llmc/parallel/pp_validate.h"

static int failures = 0;
static void report(const char* name, int ok, const std::string& detail) {
    printf("%s %-66s %s\n", ok ? "PASS" : "FAIL", name, detail.c_str());
    if (!ok) { failures++; }
}

static const int PS[5] = {1, 2, 3, 4, 8}, MS[6] = {1, 2, 3, 4, 8, 16};

// the v's of the grid for a schedule
static std::vector<int> grid_vs(int kind) {
    if (kind == PP_INTERLEAVED) { return std::vector<int>{2, 3, 4}; }
    return std::vector<int>{1};
}

static PPCosts costs(double f, double b, double w) {
    PPCosts c = {f, b, w, 0.0};
    return c;
}

// ---- a) build and validate
static void test_grid(void) {
    for (int k = 0; k < PP_NUM_SCHEDULES; k++) {
        int built = 0, refused = 0, bad_refusals = 0, sends_first = 1;
        std::string first;
        for (int p : PS) {
            for (int m : MS) {
                for (int v : grid_vs(k)) {
                    std::string why = pp_schedule_check(k, p, m, v);
                    int expect_refused = k == PP_INTERLEAVED && (m % p != 0 || p == 1);
                    if (!why.empty() != expect_refused) {
                        bad_refusals++;
                        if (first.empty()) { first = pp_fmt("p %d m %d v %d: check says '%s'", p, m, v, why.c_str()); }
                    }
                    if (!why.empty()) {
                        refused++;
                        continue;
                    }
                    PPSchedule s = pp_build(k, p, m, v);
                    std::string bad = pp_validate(s);
                    if (!bad.empty() && first.empty()) { first = pp_fmt("p %d m %d v %d: %s", p, m, v, bad.c_str()); }
                    if (bad.empty()) { built++; }
                    for (const std::vector<PPAction>& list : s.stages) {
                        for (int i = 0; i < (int)list.size();) {
                            int j = pp_exchange_end(list, i), seen_recv = 0;
                            for (int x = i; x < j; x++) {
                                if (!pp_is_send(list[x].kind)) { seen_recv = 1; }
                                if (pp_is_send(list[x].kind) && seen_recv) { sends_first = 0; }
                            }
                            i = j > i ? j : i + 1;
                        }
                    }
                }
            }
        }
        std::string name = pp_fmt("a) %s builds and validates on the grid, no deadlock", pp_schedule_name(k));
        report(name.c_str(), first.empty(),
               first.empty() ? pp_fmt("%d schedules, %d refused by pp_schedule_check", built, refused) : first);
        if (k == PP_INTERLEAVED) {
            report("a) check refuses exactly interleaved's m % p != 0 and p = 1", bad_refusals == 0,
                   pp_fmt("%d refused", refused));
        }
        name = pp_fmt("a) %s: every exchange lists its sends first", pp_schedule_name(k));
        report(name.c_str(), sends_first, "");
    }
}

// pp_simulate stops the program on a deadlock; a broken schedule here gives NaN instead, so
// that every check still runs and fails
static PPSim simulate(const PPSchedule& s, PPCosts c) {
    if (pp_validate(s).empty()) { return pp_simulate(s, c); }
    PPSim r;
    r.makespan = r.bubble = NAN;
    r.peak_inflight.assign(s.p, -1);
    return r;
}

// ---- b) bubbles
// the largest |simulated - formula| over the grid (m >= p only if min_m_p), and where
static double max_bubble_error(int kind, PPCosts c, int min_m_p, std::string* where) {
    double worst = 0.0;
    for (int p : PS) {
        for (int m : MS) {
            for (int v : grid_vs(kind)) {
                if (!pp_schedule_check(kind, p, m, v).empty() || (min_m_p && m < p)) { continue; }
                PPSchedule s = pp_build(kind, p, m, v);
                PPSim sim = simulate(s, c);
                double f = pp_formula_bubble(kind, p, m, v, c);
                double e = isnan(sim.bubble) ? INFINITY : fabs(sim.bubble - f);
                if (e > worst || where->empty()) {
                    worst = std::max(worst, e);
                    *where = pp_fmt("p %d m %d v %d: simulated %.6f formula %.6f", p, m, v, sim.bubble, f);
                }
            }
        }
    }
    return worst;
}

static void test_bubbles(void) {
    PPCosts c120 = costs(1, 2, 0), c111 = costs(1, 1, 1);
    for (int k : {PP_GPIPE, PP_1F1B}) {
        for (PPCosts c : {c120, c111}) {
            std::string where;
            double e = max_bubble_error(k, c, 0, &where);
            std::string name = pp_fmt("b) %s bubble = (p-1)/(m+p-1) of the step [(p-1)/m of ideal], f b w = %g %g %g", pp_schedule_name(k), c.f, c.b, c.w);
            report(name.c_str(), e <= 1e-9, pp_fmt("max error %.1e; worst %s", e, where.c_str()));
        }
    }
    {
        std::string where;
        double e = max_bubble_error(PP_INTERLEAVED, c120, 0, &where);
        report("b) interleaved bubble = (p-1)/(v m+p-1) of the step [(p-1)/(v m) of ideal], f b w = 1 2 0", e <= 1e-9,
               pp_fmt("max error %.1e; worst %s", e, where.c_str()));
    }
    {
        std::string where;
        double e = max_bubble_error(PP_ZBH1, c111, 1, &where);
        report("b) zb-h1 bubble = (p-1)/(3m+p-1), f = b = w = 1, m >= p", e <= 1e-9,
               pp_fmt("max error %.1e; worst %s", e, where.c_str()));
        // the paper's formula holds for this schedule whenever w <= min(f, b)
        double worst = 0.0;
        std::string at;
        for (PPCosts c : {costs(2, 1, 1), costs(1, 2, 1), costs(1, 1, 0.5), costs(3, 2, 1.5), costs(1, 1, 0)}) {
            std::string w2;
            double e2 = max_bubble_error(PP_ZBH1, c, 1, &w2);
            if (e2 >= worst) {
                worst = e2;
                at = pp_fmt("f b w %g %g %g, %s", c.f, c.b, c.w, w2.c_str());
            }
        }
        report("b) zb-h1 bubble = the paper's formula for 5 costs with w <= min(f,b)", worst <= 1e-9,
               pp_fmt("max error %.1e; worst %s", worst, at.c_str()));
    }
    {
        // zb-h1 (B = 1, W = 1) against 1f1b (B = b + w = 2), every p >= 2 and m of the grid
        int below = 1;
        std::string detail = "p 4 m 8: ";
        for (int p : PS) {
            for (int m : MS) {
                if (p < 2) { continue; }
                double zb = simulate(pp_build(PP_ZBH1, p, m, 1), c111).bubble;
                double one = simulate(pp_build(PP_1F1B, p, m, 1), c111).bubble;
                if (!(zb < one)) {
                    below = 0;
                    detail = pp_fmt("p %d m %d: zb-h1 %.4f, 1f1b %.4f", p, m, zb, one);
                }
                if (below && p == 4 && m == 8) { detail += pp_fmt("zb-h1 %.4f < 1f1b %.4f", zb, one); }
            }
        }
        report("b) zb-h1's bubble is below 1f1b's for every p >= 2, m (f = b = w = 1)", below, detail);
    }
    {
        // 1f1b, p = 2, m = 1, comm 0.5: F0 [0,1], a0 delivered at 1.5, F0 [1.5,2.5], B0 [2.5,4.5],
        // g0 delivered at 5, B0 [5,7]
        PPCosts c = {1, 1, 1, 0.5};
        PPSim sim = simulate(pp_build(PP_1F1B, 2, 1, 1), c);
        report("b) a message costs comm once per hop (1f1b p 2 m 1, comm 0.5)", fabs(sim.makespan - 7.0) < 1e-12,
               pp_fmt("makespan %g, want 7", sim.makespan));
    }
}

// ---- c) peak in flight
static void test_peaks(void) {
    PPCosts c = costs(1, 1, 1);
    int ok_gpipe = 1, ok_1f1b = 1, ok_zb = 1, ok_zb_b = 1, ok_int = 1, ok_same = 1;
    std::string d_int, d_same, d_zb;
    for (int k = 0; k < PP_NUM_SCHEDULES; k++) {
        for (int p : PS) {
            for (int m : MS) {
                for (int v : grid_vs(k)) {
                    if (!pp_schedule_check(k, p, m, v).empty()) { continue; }
                    PPSchedule s = pp_build(k, p, m, v);
                    std::vector<int> peak = pp_peak_inflight(s);
                    PPSim sim = simulate(s, c);
                    if (peak != sim.peak_inflight) {
                        ok_same = 0;
                        d_same = pp_fmt("%s p %d m %d v %d", pp_schedule_name(k), p, m, v);
                    }
                    for (int st = 0; st < p; st++) {
                        if (k == PP_GPIPE && peak[st] != m) { ok_gpipe = 0; }
                        if (k == PP_1F1B && peak[st] != std::min(p - st, m)) { ok_1f1b = 0; }
                        if (k == PP_ZBH1 && peak[st] != std::min(p, m)) {
                            ok_zb = 0;
                            d_zb = pp_fmt("p %d m %d stage %d: %d", p, m, st, peak[st]);
                        }
                    }
                    if (k == PP_ZBH1 && pp_peak_inflight_until(s, PP_B) != pp_peak_inflight(pp_build(PP_1F1B, p, m, 1))) {
                        ok_zb_b = 0;
                    }
                    if (k == PP_INTERLEAVED) {
                        int warm = std::min(2 * (p - 1) + (v - 1) * p, m * v);
                        int want = std::min(warm + 1, m * v);
                        if (peak[0] != want) {
                            ok_int = 0;
                            d_int = pp_fmt("p %d m %d v %d: %d, want %d", p, m, v, peak[0], want);
                        }
                    }
                }
            }
        }
    }
    report("c) gpipe: m micro-batches in flight on every stage", ok_gpipe, "");
    report("c) 1f1b: min(p-s, m) in flight on stage s", ok_1f1b, "");
    report("c) zb-h1: min(p, m) from F to W on every stage (1f1b's stage 0)", ok_zb, d_zb);
    report("c) zb-h1: from F to B exactly 1f1b's min(p-s, m)", ok_zb_b, "");
    report("c) interleaved: stage 0 holds min(warm-up + 1, m v) chunk activations", ok_int, d_int);
    report("c) pp_peak_inflight (static) = the simulator's, every schedule", ok_same, d_same);
}

// ---- d) broken lists
static int find(const std::vector<PPAction>& list, int kind, int micro) {
    for (int i = 0; i < (int)list.size(); i++) {
        if (list[i].kind == kind && list[i].micro == micro) { return i; }
    }
    return -1;
}

static void expect_rejected(const char* name, const PPSchedule& s, const char* words) {
    std::string why = pp_validate(s);
    report(name, !why.empty() && why.find(words) != std::string::npos, why.empty() ? "accepted" : why);
}

static void test_broken(void) {
    {
        PPSchedule s = pp_build(PP_1F1B, 2, 2, 1);
        report("d) the unbroken 1f1b p 2 m 2 validates", pp_validate(s).empty(), pp_validate(s));
        std::vector<PPAction>& l = s.stages[1];
        std::swap(l[find(l, PP_F, 0)], l[find(l, PP_B, 0)]);
        expect_rejected("d) a B before its F", s, "comes before its forward F0");
    }
    {
        PPSchedule s = pp_build(PP_1F1B, 2, 2, 1);
        s.stages[1].erase(s.stages[1].begin() + find(s.stages[1], PP_RECV_ACT, 0));
        s.stages[0].erase(s.stages[0].begin() + find(s.stages[0], PP_SEND_ACT, 0));
        expect_rejected("d) a missing receive (and its send)", s, "F0 has 0 receives of its input activation from stage 0");
    }
    {
        PPSchedule s = pp_build(PP_1F1B, 2, 2, 1);
        s.stages[1].erase(s.stages[1].begin() + find(s.stages[1], PP_RECV_ACT, 1));
        expect_rejected("d) a send with no receive", s, "no matching receive");
    }
    {
        // stage 1: ... F1 [recv a1<0] ...: the receive after the compute that needs it
        PPSchedule s = pp_build(PP_1F1B, 2, 2, 1);
        std::vector<PPAction>& l = s.stages[1];
        PPAction r = l[find(l, PP_RECV_ACT, 1)];
        l.erase(l.begin() + find(l, PP_RECV_ACT, 1));
        l.insert(l.begin() + find(l, PP_F, 1) + 1, r);
        expect_rejected("d) a receive after the compute that needs it", s, "comes after F1");
    }
    {
        // gpipe stage 0: F0 [send a0] F1 [send a1 recv g1] ...: move send a0 after send a1
        PPSchedule s = pp_build(PP_GPIPE, 2, 2, 1);
        std::vector<PPAction>& l = s.stages[0];
        PPAction a0 = l[find(l, PP_SEND_ACT, 0)];
        l.erase(l.begin() + find(l, PP_SEND_ACT, 0));
        l.insert(l.begin() + find(l, PP_SEND_ACT, 1) + 1, a0);
        expect_rejected("d) two sends on a pair in swapped order", s, "another order");
    }
    {
        // 1f1b p 2 m 1, stage 0: F0 [recv g0<1] B0 [send a0>1]: waits for the gradient of the
        // activation it has not sent; stage 1 waits for that activation
        PPSchedule s = pp_build(PP_1F1B, 2, 1, 1);
        std::vector<PPAction>& l = s.stages[0];
        l.clear();
        pp_push(l, PP_F, 0, 0, -1);
        pp_push(l, PP_RECV_GRAD, 0, 0, 1);
        pp_push(l, PP_B, 0, 0, -1);
        pp_push(l, PP_SEND_ACT, 0, 0, 1);
        expect_rejected("d) a deadlock: a gradient received before its activation is sent", s,
                        "deadlock (an exchange completes only when the peers have posted the matching operations): "
                        "stage 0 waits in [recv g0<1], stage 1 waits in [recv a0<0]");
    }
    {
        PPSchedule s = pp_build(PP_ZBH1, 2, 2, 1);
        std::vector<PPAction>& l = s.stages[0];
        l.erase(l.begin() + find(l, PP_W, 1));
        expect_rejected("d) zb-h1 with a W missing", s, "W 0 times");
    }
}

// ---- e) checks, names, tags
static void test_checks(void) {
    std::string a = pp_schedule_check(PP_INTERLEAVED, 4, 6, 2), b = pp_schedule_check(PP_1F1B, 4, 8, 2);
    std::string c = pp_schedule_check(PP_INTERLEAVED, 1, 4, 2), d = pp_schedule_check(PP_GPIPE, 2, 65, 1);
    report("e) check refuses interleaved with m % p != 0", a.find("not a multiple of p") != std::string::npos, a);
    report("e) check refuses v >= 2 on a non-interleaved schedule", b.find("use v = 1") != std::string::npos, b);
    report("e) check refuses interleaved on one stage", !c.empty(), c);
    report("e) check refuses m > 64", !d.empty(), d);
    report("e) check refuses m = 0, p = 0, v = 0, an unknown schedule",
           !pp_schedule_check(PP_1F1B, 2, 0, 1).empty() && !pp_schedule_check(PP_1F1B, 0, 2, 1).empty() &&
               !pp_schedule_check(PP_1F1B, 2, 2, 0).empty() && !pp_schedule_check(7, 2, 2, 1).empty(), "");
    int names = pp_schedule_parse("bogus") == -1;
    for (int k = 0; k < PP_NUM_SCHEDULES; k++) { names &= pp_schedule_parse(pp_schedule_name(k)) == k; }
    report("e) names parse back; an unknown name is -1", names, "gpipe 1f1b interleaved zb-h1");
    // the largest schedule the tags allow: every message's tag distinct, in [0, 32767)
    PPSchedule s = pp_build(PP_INTERLEAVED, 8, 64, 16);
    std::vector<int> seen(32767, 0);
    int ok = 1, n = 0, top = 0;
    for (int st = 0; st < s.p; st++) {
        for (const PPAction& x : s.stages[st]) {
            if (!pp_is_send(x.kind)) { continue; }
            int t = pp_message_tag(pp_is_grad(x.kind), x.micro, pp_sender_chunk(s, st, x));
            if (t < 0 || t >= 32767 || seen[t]) {
                ok = 0;
                continue;
            }
            seen[t] = 1;
            top = std::max(top, t);
            n++;
        }
    }
    std::string why = pp_validate(s);
    report("e) tags unique and < 32767 (interleaved p 8 m 64 v 16), validates", ok && why.empty(),
           pp_fmt("%d messages, largest tag %d %s", n, top, why.c_str()));
}

// ---- f) zb-h1's lists for the executor
static void test_zb_lists(void) {
    int ok = 1;
    std::string detail;
    for (int p : PS) {
        for (int m : MS) {
            PPSchedule s = pp_build(PP_ZBH1, p, m, 1);
            for (int st = 0; st < p; st++) {
                const std::vector<PPAction>& l = s.stages[st];
                for (int i = 0; i < (int)l.size(); i++) {
                    if (!pp_is_comm(l[i].kind)) { continue; }
                    int want = l[i].kind == PP_SEND_ACT || l[i].kind == PP_RECV_ACT ? PP_F : PP_B;
                    int step = pp_is_send(l[i].kind) ? -1 : 1, k = i + step;
                    // walk to the compute it belongs to: only comm (receive) or comm and W (send) between
                    while (k >= 0 && k < (int)l.size() && !(l[k].kind == want && l[k].micro == l[i].micro)) {
                        if (l[k].kind == PP_F || l[k].kind == PP_B || (step == 1 && l[k].kind == PP_W)) { break; }
                        k += step;
                    }
                    if (k < 0 || k >= (int)l.size() || l[k].kind != want || l[k].micro != l[i].micro) {
                        ok = 0;
                        detail = pp_fmt("p %d m %d stage %d: %s", p, m, st, pp_action_label(s, l[i]).c_str());
                    }
                }
            }
        }
    }
    report("f) zb-h1: receive right before its compute, send after it with only W's between", ok, detail);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_grid();
    test_bubbles();
    test_peaks();
    test_broken();
    test_checks();
    test_zb_lists();
    printf("%s: %d failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
