// --profile's report (the recorder is llmc/profile.h): at start-up this machine's two ceilings,
// after the run a table of the step's operations set against them, and the step's distance
// from the roofline.
//
// The roofline (Williams, Waterman and Patterson, 2009): an operation that does F FLOPs and must
// move Q bytes takes at least
//     bound = max( F / peak FLOP/s ,  Q / memory bandwidth )
// Its arithmetic intensity I = F / Q decides which term wins: above the ridge point
// peak / bandwidth (FLOPs per byte) the operation is compute-bound, below it memory-bound.
// "of bound" is bound / measured time: 100% is as fast as this machine allows. The step's
// bound is the sum of its operations' bounds; step time / that sum says how much time better
// kernels could still win (1.0 would be perfect; time outside the operations counts against it).
#pragma once

#include <stdio.h>
#include "../profile.h"
#include "../backend.h"   // floatX, backend_measure_ceilings

typedef struct {
    double peak, bandwidth;   // FLOP/s, bytes/s
    char how[256];            // how they were measured
} Ceilings;
static Ceilings g_ceilings;

// --profile: measure the ceilings and start recording from the second step on (train_gpt2.cu).
// They are measured again after the run and the higher of each kept: a ceiling is a bound, and a
// measurement of a fraction of a second on a shared machine can come out low.
static inline void profile_start(int print) {
    g_profile.enabled = 1;
    backend_measure_ceilings(&g_ceilings.peak, &g_ceilings.bandwidth, g_ceilings.how, sizeof(g_ceilings.how));
    if (!print) { return; }
    printf("profile      ceilings %.1f GFLOP/s and %.1f GB/s, ridge point %.1f FLOP/byte (%s)\n", g_ceilings.peak * 1e-9,
           g_ceilings.bandwidth * 1e-9, g_ceilings.peak / g_ceilings.bandwidth, g_ceilings.how);
}

static inline double profile_bytes(const OpCost* c) {
    return (double)sizeof(floatX) * (c->x_read + c->x_written) + 4.0 * (c->f_read + c->f_written);
}
static inline double profile_bound_seconds(const OpCost* c) {
    double compute = c->flops / g_ceilings.peak, memory = profile_bytes(c) / g_ceilings.bandwidth;
    return compute > memory ? compute : memory;
}

// The step's figures, per recorded step: its time, the operations' time, and the roofline bound
typedef struct { double step, ops, bound; } ProfileTotals;
static inline ProfileTotals profile_totals(void) {
    ProfileTotals t = {0, 0, 0};
    int n = g_profile.steps;
    if (n == 0) { return t; }
    t.step = g_profile.step_seconds / n;
    for (int i = 0; i < g_profile.nrows; i++) {
        t.ops += g_profile.rows[i].seconds / n;
        t.bound += profile_bound_seconds(&g_profile.rows[i].cost) / n;
    }
    return t;
}

static inline void profile_print_row(const ProfileRow* r, int n, double step) {
    static const char* parts[4] = {"fwd", "bwd", "update", "comm"};
    char name[48];
    if (r->d1 > 0) { snprintf(name, sizeof(name), "%s %dx%d", r->name, r->d1, r->d2); }
    else { snprintf(name, sizeof(name), "%s", r->name); }
    double s = r->seconds / n;
    printf("%-22s %-6s %6.1f %9.2f %6.1f%%", name, parts[r->part], (double)r->calls / n, s * 1e3, 100.0 * s / step);
    if (r->part == OP_COMM) { printf("\n"); return; }   // time only
    double f = r->cost.flops / n, q = profile_bytes(&r->cost) / n, bound = profile_bound_seconds(&r->cost) / n;
    int compute = f / q > g_ceilings.peak / g_ceilings.bandwidth;
    printf(" %9.3f %9.1f %7.2f %8.1f %7.1f %9.2f %6.0f%%  %s\n", f * 1e-9, q * 1e-6, q > 0 ? f / q : 0.0,
           s > 0 ? f / s * 1e-9 : 0.0, s > 0 ? q / s * 1e-9 : 0.0, bound * 1e3, s > 0 ? 100.0 * bound / s : 0.0,
           compute ? "compute" : "memory");
}

// After the run (rank 0's operations). dp_seconds, dp_exposed: data parallelism's communication per
// step on its own thread, and the part of it the step waited for (inside "other").
static inline void profile_print(double dp_seconds, double dp_exposed) {
    int n = g_profile.steps;
    if (!g_profile.enabled || n == 0) { return; }
    Ceilings again;
    backend_measure_ceilings(&again.peak, &again.bandwidth, again.how, sizeof(again.how));
    printf("profile      ceilings measured again after the run: %.1f GFLOP/s and %.1f GB/s (%s); the higher of each counts\n",
           again.peak * 1e-9, again.bandwidth * 1e-9, again.how);
    if (again.peak > g_ceilings.peak) { g_ceilings.peak = again.peak; }
    if (again.bandwidth > g_ceilings.bandwidth) { g_ceilings.bandwidth = again.bandwidth; }
    ProfileTotals t = profile_totals();
    printf("\nprofile: %d step%s recorded (the first is not), rank 0; per step. GFLOP and MB: what the operation computes "
           "and must move; bound: max(FLOPs / %.1f GFLOP/s, bytes / %.1f GB/s)\n", n, n > 1 ? "s" : "",
           g_ceilings.peak * 1e-9, g_ceilings.bandwidth * 1e-9);
    printf("%-22s %-6s %6s %9s %7s %9s %9s %7s %8s %7s %9s %7s  %s\n", "operation", "part", "calls", "ms", "share", "GFLOP",
           "MB", "FLOP/B", "GFLOP/s", "GB/s", "bound ms", "of bnd", "bound by");
    for (int part = OP_FWD; part <= OP_COMM; part++) {
        for (int i = 0; i < g_profile.nrows; i++) {
            if (g_profile.rows[i].part == part) { profile_print_row(&g_profile.rows[i], n, t.step); }
        }
    }
    double other = t.step - t.ops;
    printf("%-22s %-6s %6s %9.2f %6.1f%%   (host work, waits and kernels outside the table)\n", "other", "", "", other * 1e3,
           100.0 * other / t.step);
    printf("%-22s %-6s %6s %9.2f %6.1f%%\n", "step", "", "", t.step * 1e3, 100.0);
    if (dp_seconds > 1e-5) {
        printf("data-parallel communication on its own thread: %.2f ms per step, %.2f ms of it waited for (in \"other\")\n",
               dp_seconds * 1e3, dp_exposed * 1e3);
    }
    printf("roofline     step %.2f ms, bound %.2f ms: the step takes %.2fx this machine's roofline\n", t.step * 1e3,
           t.bound * 1e3, t.step / t.bound);
}
