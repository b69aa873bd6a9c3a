// What a pipeline step measures on its stage, for the report after it (pp_accounting.h): the
// wall time of the schedule, the time and count of its F, B and W, and the time in messages.
// Each action is also a trace event (trace.h): compute on track 0, messages on track 3.
#pragma once

#include <stdio.h>
#include <string.h>
#include "../trace.h"
#include "pp_1f1b.h"

typedef struct {
    double t_start, t_end, busy;   // wall time of the schedule on this stage, time in F/B/W
    double act_seconds[3];         // F, B, W: time and count this step
    int act_count[3];
    double comm_seconds;           // time in exchanges and in the embedding group's all-reduce
} PPMeasure;

static inline void pp_measure_start(PPMeasure* s) {
    *s = PPMeasure{};
    s->t_start = trace_now();
}

// compute action a (of a stage with v chunks per stage), begun at t0, has ended
static inline void pp_measure_compute(PPMeasure* s, const PPAction* a, int v, double t0) {
    double dt = trace_now() - t0;
    int k = a->kind == PP_F ? 0 : a->kind == PP_B ? 1 : 2;
    s->act_seconds[k] += dt;
    s->act_count[k]++;
    s->busy += dt;
    char name[32];
    snprintf(name, sizeof(name), "%c%d%s", "FBW"[k], a->micro, v > 1 ? (a->chunk == 0 ? "" : a->chunk == 1 ? "'" : "''") : "");
    trace_event(name, 0, t0);
}

// an exchange's name for the trace, message by message: "send a3, recv g1"
static inline void pp_measure_name(char* name, size_t size, const PPAction* a) {
    size_t len = strlen(name);
    snprintf(name + len, size - len, "%s%s %c%d", len ? ", " : "", pp_is_send(a->kind) ? "send" : "recv",
             pp_is_grad(a->kind) ? 'g' : 'a', a->micro);
}

// a communication named `name`, begun at t0, has ended
static inline void pp_measure_comm(PPMeasure* s, const char* name, double t0) {
    s->comm_seconds += trace_now() - t0;
    trace_event(name, 3, t0);
}
