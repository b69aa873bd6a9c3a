// --profile: where a training step's time goes, operation by operation. Each kernel entry point
// opens with one line, PROFILE_OP(name, part, cost[, d1, d2]): a scope that, while a timed
// step is being recorded, adds the kernel's time, its FLOPs and the bytes it must move (the cost,
// from llmc/profile_costs.h) to its row of the table. Rows are told apart by name, direction and
// up to two sizes (a matmul's C and OC). Otherwise the line does nothing but compare a flag.
//
// After the run, llmc/train/profile_report.h sets each row against this machine's roofline: an
// operation needs at least max(FLOPs / peak FLOP/s, bytes / bandwidth) seconds, and is
// compute-bound when its arithmetic intensity (FLOPs per byte) is above peak / bandwidth.
//
// A scope inside another (adamw_update calling adamw_host) is not counted twice: only the
// outermost one records. The CPU times a scope with the wall clock; the CUDA backend records a
// pair of CUDA events around it (llmc/profile_events.cuh) and reads them at the step's end.
#pragma once

#include <string.h>
#include <time.h>

#include "profile_costs.h"   // OpCost: what each operation computes and moves

// which part of the step a row belongs to
#define OP_FWD 0
#define OP_BWD 1
#define OP_UPD 2    // zeroing the gradients, their norm, AdamW
#define OP_COMM 3   // communication on the compute thread (llmc/trace.h)

typedef struct {
    const char* name;   // a string literal: "matmul", "layernorm", ...
    int part, d1, d2;   // part: OP_FWD .. OP_COMM
    long calls;
    double seconds;
    OpCost cost;        // summed over the calls
} ProfileRow;

#define PROFILE_MAX_ROWS 64
typedef struct {
    int enabled;        // --profile
    int recording;      // inside a timed step (profile_step_begin .. profile_step_end)
    int depth;          // scopes open now
    int nrows;
    ProfileRow rows[PROFILE_MAX_ROWS];
    int steps;
    double step_seconds;   // the recorded steps' time, as the trainer measured it
} Profiler;
static Profiler g_profile;
// the thread that runs the step: only its scopes record (the asynchronous parameter server's
// thread runs AdamW and the norm beside it, llmc/parallel/dp_ps_async_server.h)
static thread_local int g_profile_this_thread = 0;

static inline double profile_clock() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int profile_row(const char* name, int part, int d1, int d2) {
    for (int i = 0; i < g_profile.nrows; i++) {
        const ProfileRow* r = &g_profile.rows[i];
        if (r->part == part && r->d1 == d1 && r->d2 == d2 && strcmp(r->name, name) == 0) { return i; }
    }
    if (g_profile.nrows == PROFILE_MAX_ROWS) { return -1; }   // (never with GPT-2's operations)
    ProfileRow* r = &g_profile.rows[g_profile.nrows];
    memset(r, 0, sizeof(*r));
    r->name = name;
    r->part = part;
    r->d1 = d1;
    r->d2 = d2;
    return g_profile.nrows++;
}

// the time of one scope: the wall clock on the CPU, a pair of CUDA events on the GPU
#if (defined(__CUDACC__) || defined(LLMC_EMU)) && !defined(LLMC_CPU)   // the CUDA backend, on a GPU or the emulator (dev/emu)
#include "profile_events.cuh"   // profile_timer_begin / profile_timer_end, read at the step's end
#else
static inline double profile_timer_begin() { return profile_clock(); }
static inline void profile_timer_end(int row, double t0) { g_profile.rows[row].seconds += profile_clock() - t0; }
static inline void profile_timers_collect() {}
#endif

struct ProfileScope {
    int row;
    double t0;
    ProfileScope(const char* name, int part, OpCost cost, int d1 = 0, int d2 = 0) : row(-1), t0(0.0) {
        if (!g_profile.recording || !g_profile_this_thread || g_profile.depth++ > 0) { return; }
        row = profile_row(name, part, d1, d2);
        if (row < 0) { return; }
        ProfileRow* r = &g_profile.rows[row];
        r->calls++;
        r->cost.flops += cost.flops;
        r->cost.x_read += cost.x_read;
        r->cost.x_written += cost.x_written;
        r->cost.f_read += cost.f_read;
        r->cost.f_written += cost.f_written;
        t0 = profile_timer_begin();
    }
    ~ProfileScope() {
        if (!g_profile.recording || !g_profile_this_thread) { return; }
        g_profile.depth--;
        if (row >= 0) { profile_timer_end(row, t0); }
    }
};
// the cost (llmc/profile_costs.h) is worked out only while --profile records
#define PROFILE_OP(name, part, cost, ...) ProfileScope profile_scope_(name, part, g_profile.recording ? (cost) : OpCost{}, ##__VA_ARGS__)

// Communication the compute thread waited for (tensor, pipeline, context and expert parallelism
// report theirs to llmc/trace.h): a row per kind, time only. Not inside an operation's scope.
static inline void profile_communication(const char* kind, double seconds) {
    if (!g_profile.recording || !g_profile_this_thread || g_profile.depth > 0) { return; }
    int row = profile_row(kind, OP_COMM, 0, 0);
    if (row < 0) { return; }
    g_profile.rows[row].calls++;
    g_profile.rows[row].seconds += seconds;
}

// around each timed step (train_gpt2.cu): the first step, which warms the caches up, is not recorded
static inline void profile_step_begin(int counted) {
    g_profile.recording = g_profile.enabled && counted;
    g_profile.depth = 0;
    g_profile_this_thread = 1;
}
static inline void profile_step_end(double seconds) {
    if (!g_profile.recording) { return; }
    profile_timers_collect();
    g_profile.recording = 0;
    g_profile.steps++;
    g_profile.step_seconds += seconds;
}

