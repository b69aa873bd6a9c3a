// pp_sim: the pipeline schedules of llmc/parallel/pp_schedule.h built, checked (pp_validate.h)
// and timed (pp_simulate.h) on paper, no model and no GPU: the lecture's timeline of each
// schedule (pp_timeline.h), its simulated bubble beside the formula, and how many micro-batches
// each stage holds at once.
//   g++ -std=c++17 -O2 -x c++ -DLLMC_CPU dev/pp_sim/pp_sim.cu -o pp_simcpu          (make pp_simcpu)
//   ./pp_simcpu --schedule all --p 4 --m 8 --v 2
//   ./pp_simcpu --schedule zb-h1 --p 4 --m 8 --lists      the action lists (sends, receives)
//   ./pp_simcpu --table                                    bubble table for the doc
//
//   zb-h1  p 4  m 8  v 1: ...
//   stage 0 |F0 F1 F2 F3 .........B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7
//   ...
//   makespan 27, bubble 11.11% simulated, 11.11% formula; peak in flight per stage: 4 4 4 4
//
// Costs are per model chunk, in any unit: --f forward, --b backward to the input, --w backward
// to the weights (a schedule that does not split the backward runs B costing b + w), --comm one
// message's latency. The default f = b = w = 1 gives the lecture's t_b = 2 t_f. --v is the
// interleaved schedule's chunks per stage (default 2; with --schedule all the others run v = 1,
// with one named schedule --v is its own and pp_schedule_check says when it does not exist).
// With --schedule all a schedule that does not exist for these p, m, v is named and skipped;
// with one schedule it is an error (exit 1), as is a bad flag.
#include "../../llmc/common.h"
#include "../../llmc/plan/flag_parser.h"
#include "../../llmc/parallel/pp_validate.h"
#include "../../llmc/parallel/pp_timeline.h"

static void show(int kind, int p, int m, int v, PPCosts c, int lists) {
    PPSchedule s = pp_build(kind, p, m, v);
    std::string bad = pp_validate(s);
    if (!bad.empty()) { die("%s p %d m %d v %d does not validate: %s", pp_schedule_name(kind), p, m, v, bad.c_str()); }
    PPSim sim = pp_simulate(s, c);
    pp_print_timeline(stdout, s, sim);
    if (lists) { pp_print_lists(stdout, s); }
    printf("\n");
}

// bubble (simulated / formula) for p in {2, 4, 8}, m in {1, 2, 4, 8, 16}, every schedule;
// interleaved with v = 2 where m % p == 0
static void table(PPCosts c) {
    printf("bubble fraction, simulated / formula (f %g, b %g, w %g, comm %g; interleaved v = 2)\n", c.f, c.b, c.w, c.comm);
    printf("%3s %3s", "p", "m");
    for (int k = 0; k < PP_NUM_SCHEDULES; k++) { printf("  %-17s", pp_schedule_name(k)); }
    printf("\n");
    const int ps[3] = {2, 4, 8}, ms[5] = {1, 2, 4, 8, 16};
    for (int pi = 0; pi < 3; pi++) {
        for (int mi = 0; mi < 5; mi++) {
            int p = ps[pi], m = ms[mi];
            printf("%3d %3d", p, m);
            for (int k = 0; k < PP_NUM_SCHEDULES; k++) {
                int v = k == PP_INTERLEAVED ? 2 : 1;
                if (!pp_schedule_check(k, p, m, v).empty()) {
                    printf("  %-17s", "-");
                    continue;
                }
                PPSchedule s = pp_build(k, p, m, v);
                std::string bad = pp_validate(s);
                if (!bad.empty()) { die("%s p %d m %d v %d does not validate: %s", pp_schedule_name(k), p, m, v, bad.c_str()); }
                PPSim sim = pp_simulate(s, c);
                printf("  %7.4f / %7.4f", sim.bubble, pp_formula_bubble(k, p, m, v, c));
            }
            printf("\n");
        }
    }
}

int main(int argc, char** argv) {
    const char* schedule = "all";
    int p = 4, m = 8, v = 0, lists = 0, want_table = 0;
    float f = 1.0f, b = 1.0f, w = 1.0f, comm = 0.0f;
    ArgSpec specs[] = {
        {"schedule", ARG_STRING, &schedule, "gpipe, 1f1b, interleaved, zb-h1 or all"},
        {"p", ARG_INT, &p, "pipeline stages"},
        {"m", ARG_INT, &m, "micro-batches per step"},
        {"v", ARG_INT, &v, "model chunks per stage; 0: 2 for interleaved, 1 for the others"},
        {"f", ARG_FLOAT, &f, "one chunk's forward time"},
        {"b", ARG_FLOAT, &b, "one chunk's backward to the input (B)"},
        {"w", ARG_FLOAT, &w, "one chunk's backward to the weights (W); unsplit B costs b + w"},
        {"comm", ARG_FLOAT, &comm, "one message's latency"},
        {"lists", ARG_SWITCH, &lists, "also print each stage's action list (sends and receives)"},
        {"table", ARG_SWITCH, &want_table, "print the bubble table p in {2,4,8} x m in {1,2,4,8,16} and stop"},
    };
    const int n = (int)(sizeof(specs) / sizeof(specs[0]));
    args_parse(argc, argv, specs, n, "Builds, validates and times the pipeline schedules of llmc/parallel/pp_schedule.h.");
    if (f < 0 || b < 0 || w < 0 || comm < 0) { die("the costs --f --b --w --comm must be >= 0"); }
    if (p < 1 || m < 1 || v < 0) { die("--p and --m must be >= 1 and --v >= 0 (0: the default), got p %d m %d v %d", p, m, v); }
    PPCosts c = {f, b, w, comm};
    if (want_table) {
        table(c);
        return 0;
    }
    int all = strcmp(schedule, "all") == 0;
    int one = pp_schedule_parse(schedule);
    if (!all && one < 0) { die("unknown --schedule '%s': use gpipe, 1f1b, interleaved, zb-h1 or all", schedule); }
    printf("costs per chunk: f %g, b %g, w %g, comm %g\n\n", f, b, w, comm);
    int shown = 0;
    for (int k = 0; k < PP_NUM_SCHEDULES; k++) {
        if (!all && k != one) { continue; }
        int kv = v == 0 || (all && k != PP_INTERLEAVED) ? (k == PP_INTERLEAVED ? 2 : 1) : v;
        std::string why = pp_schedule_check(k, p, m, kv);
        if (!why.empty()) {
            if (!all) { die("%s", why.c_str()); }
            printf("%s: skipped: %s\n\n", pp_schedule_name(k), why.c_str());
            continue;
        }
        show(k, p, m, kv, c, lists);
        shown++;
    }
    if (shown == 0) { die("no schedule exists for p %d, m %d (see the lines above)", p, m); }
    return 0;
}
