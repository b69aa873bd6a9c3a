// A pipeline schedule drawn as text: each stage's list with its exchanges in brackets
// (pp_print_lists), and the timeline the lecture draws (pp_print_timeline), one row per stage,
// from a simulation (pp_simulate.h). ./pp_simcpu and the trainer's --pp-print print them.
#pragma once

#include <stdio.h>
#include "pp_simulate.h"

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
