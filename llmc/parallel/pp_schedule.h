// Any of the four pipeline schedules by its kind: the names the flags use, the check that a
// schedule exists for p, m and v (one sentence with the fix when it does not), and pp_build,
// which makes each stage's list: GPipe and 1F1B (pp_1f1b.h), Megatron-LM's interleaved 1F1B
// (pp_interleaved.h: v chunks per stage, a v times smaller bubble), Zero Bubble's ZB-H1
// (pp_zbh1.h: the backward cut into B and W). pp_simulate.h times them.
//
// Cost: O(v m) actions per stage.
#pragma once

#include <stdio.h>
#include <stdarg.h>
#include "pp_1f1b.h"
#include "pp_interleaved.h"
#include "pp_zbh1.h"

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

// every action a step of its own (pp_with_messages)
static inline PPSteps pp_one_per_step(const std::vector<PPAction>& order) {
    PPSteps steps;
    for (const PPAction& a : order) { steps.push_back(std::vector<PPAction>(1, a)); }
    return steps;
}

// within each exchange of the list, the sends first (stable: their order is kept)
static inline void pp_sends_first(std::vector<PPAction>& list) {
    for (int i = 0; i < (int)list.size();) {
        int j = pp_exchange_end(list, i);
        if (j == i) { i++; continue; }
        std::stable_partition(list.begin() + i, list.begin() + j, [](const PPAction& a) { return pp_is_send(a.kind) != 0; });
        i = j;
    }
}

// the schedule: each stage's compute with its messages (ZB-H1's placed by its own rule), sends first
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
    for (int s = 0; s < p; s++) {
        if (kind == PP_GPIPE) { sc.stages[s] = pp_with_messages(pp_one_per_step(pp_gpipe_order(m)), p, v, s); }
        if (kind == PP_1F1B) { sc.stages[s] = pp_with_messages(pp_one_per_step(pp_1f1b_order(p, m, s)), p, v, s); }
        if (kind == PP_INTERLEAVED) { sc.stages[s] = pp_with_messages(pp_interleaved_steps(p, m, v, s), p, v, s); }
        if (kind == PP_ZBH1) { sc.stages[s] = pp_zbh1_order(p, m, s); }
    }
    if (kind == PP_ZBH1) { pp_zbh1_place_messages(sc); }
    for (int s = 0; s < p; s++) { pp_sends_first(sc.stages[s]); }
    return sc;
}
