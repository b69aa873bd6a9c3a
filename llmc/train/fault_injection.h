// Faults the tests inject (--fault, tests only: test/test_failures.sh), so that each failure
// doc/errors.md lists is seen handled. One fault, at step STEP (from 1, as printed):
//   nan:STEP, nan:RANK:STEP   the step's loss scale dloss is NaN, so every gradient of the step
//                             is (on that rank only: the others must skip the step with it)
//   kill:RANK:STEP            the rank kills itself (SIGKILL) at the step's start
//   hang:RANK:STEP            its main thread stops for good at the step's start, between steps;
//                             the process lives on (the --comm-timeout watchdog must name it)
//   stall:RANK:STEP           its main thread stops INSIDE the step, at the first block backward
//                             (the last block's; a hook table of its own in the model's chain)
// It plugs into the guard (llmc/train/guard.h) at the step's start (fault_step_begins) and on
// the dloss (fault_dloss); with no --fault neither does anything.
#pragma once

#include <signal.h>
#include <unistd.h>
#include <math.h>
#include "../common.h"
#include "../model/gpt2.h"

enum { FAULT_NONE, FAULT_NAN, FAULT_HANG, FAULT_KILL, FAULT_STALL };

typedef struct {
    int kind, rank, step;   // what, on which rank (-1: all), at which step (from 1)
    int me;                 // this process's rank
    int in_step;            // the step (from 1) the passes are in
    int hooked;             // the stall's hook table is in the model's chain
    GPT2Hooks hooks;
} Fault;

// --fault nan:STEP | nan:RANK:STEP | hang:RANK:STEP | kill:RANK:STEP (steps from 1, as printed)
static inline void fault_parse(Fault* f, const char* s, int me, int world_size) {
    f->kind = FAULT_NONE;
    f->rank = -1;
    f->step = 0;
    f->me = me;
    f->in_step = 0;
    f->hooked = 0;
    if (s == NULL) { return; }
    // KIND:RANK:STEP (nan:RANK:STEP: one rank's gradients only, the others must skip the step with it)
    static const struct { const char* name; int fault; } kinds[] = {
        {"nan", FAULT_NAN}, {"hang", FAULT_HANG}, {"kill", FAULT_KILL}, {"stall", FAULT_STALL}};
    char kind[8] = "";
    int a = 0, b = 0, end = 0;
    if (sscanf(s, "nan:%d%n", &a, &end) == 1 && s[end] == 0 && a >= 1) {   // every rank's
        f->kind = FAULT_NAN;
        f->step = a;
    } else if (sscanf(s, "%7[a-z]:%d:%d%n", kind, &a, &b, &end) == 3 && s[end] == 0 && a >= 0 && b >= 1) {
        for (const auto& k : kinds) {
            if (strcmp(kind, k.name) == 0) { f->kind = k.fault; }
        }
        f->rank = a;
        f->step = b;
    }
    char canonical[64];   // the numbers read back as written: one that does not fit an int is refused, not wrapped
    if (f->kind == FAULT_NAN && f->rank < 0) { snprintf(canonical, sizeof(canonical), "nan:%d", a); }
    else { snprintf(canonical, sizeof(canonical), "%s:%d:%d", kind, a, b); }
    if (f->kind == FAULT_NONE || strcmp(canonical, s) != 0) {
        die("--fault must be nan:STEP, nan:RANK:STEP, hang:RANK:STEP, stall:RANK:STEP or kill:RANK:STEP (steps from 1, "
            "whole numbers up to 2147483647), got '%s'", s);
    }
    if (f->rank >= world_size) {
        die("--fault %s: there is no rank %d (the run has %d ranks)", s, f->rank, world_size);
    }
}

// the fault strikes this rank at step s (from 1)
static inline int fault_here(const Fault* f, int s) { return f->step == s && (f->rank < 0 || f->rank == f->me); }

// stall: the main thread stops at the first block backward of its step
static inline void fault_on_block_backward(void* ctx, int l, BlockWeights* w, BlockWeights* grads) {
    (void)w; (void)grads;
    Fault* f = (Fault*)ctx;
    if (f->in_step != f->step) { return; }
    fprintf(stderr, "fault: rank %d stalls in step %d, the backward of block %d (--fault)\n", f->me, f->step, l);
    for (;;) { pause(); }
}

// At the start of step `step` (from 0), before the guard marks it: kill, hang, or (the first
// time) the stall's hook table into the model's chain (which counts a begin event once its tables
// have run, so the watchdog never sees the event the rank stops at).
static inline void fault_step_begins(Fault* f, GPT2* model, int step) {
    int s = step + 1;   // as printed
    f->in_step = s;
    if (fault_here(f, s) && f->kind == FAULT_KILL) {
        fprintf(stderr, "fault: rank %d kills itself at the start of step %d (--fault)\n", f->me, s);
        raise(SIGKILL);
    }
    if (fault_here(f, s) && f->kind == FAULT_HANG) {   // the main thread stops for good; the process lives on
        fprintf(stderr, "fault: rank %d hangs at the start of step %d (--fault)\n", f->me, s);
        for (;;) { pause(); }
    }
    if (f->kind == FAULT_STALL && f->rank == f->me && !f->hooked) {
        f->hooks = GPT2Hooks{};
        f->hooks.name = "fault: stall";
        f->hooks.ctx = f;
        f->hooks.block_backward_begin = fault_on_block_backward;
        gpt2_add_hooks(model, &f->hooks);
        f->hooked = 1;
    }
}

// The step's dloss: NaN at the nan fault's step (on its rank)
static inline float fault_dloss(const Fault* f, int step, float dloss) {
    if (f->kind == FAULT_NAN && fault_here(f, step + 1)) {
        dloss *= NAN;   // every gradient of the step (on that rank) is NaN
    }
    return dloss;
}
