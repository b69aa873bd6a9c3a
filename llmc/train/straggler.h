// A slow worker, simulated (--straggler; doc/parameter-server.md): what a straggler costs each
// data-parallel mode. Two kinds:
//   RANK:MS, random:MS   slow in wall time: the rank (or one drawn per step) sleeps MS ms at the
//                        start of the step (straggler_delay, called by the guard right after
//                        the step's progress mark: llmc/train/guard.h); what that does to the
//                        schedule depends on how fast the others are, i.e. on the machine and
//                        its load
//   hold:RANK            slow in order: the asynchronous server (llmc/parallel/dp_ps_async.h)
//                        takes that rank's requests only when no other worker can move, the
//                        slowest it can be without stopping the run; the same schedule on every
//                        run. Nothing sleeps: the server reads the flag (DPConfig.held).
// The form is checked in llmc/plan/train_args.h; the rank here, where the world size is known
// (every rank finds the same error before step 1).
#pragma once

#include <unistd.h>
#include <stdint.h>
#include "../common.h"

typedef struct {
    int rank;          // the slow rank, -1 random (one per step), -2 none (or hold:RANK)
    double ms;         //   its delay per step
    int me, world_size, seed;
} Straggler;

static inline void straggler_parse(Straggler* st, const char* s, int me, int world_size, int seed) {
    st->rank = -2;
    st->ms = 0.0;
    st->me = me;
    st->world_size = world_size;
    st->seed = seed;
    if (s == NULL) { return; }
    const char* c = strchr(s, ':');
    if (strncmp(s, "hold:", 5) == 0) {
        int held = atoi(c + 1);
        if (held >= world_size) {
            die("--straggler %s: there are only %d ranks (0 to %d): hold one of them", s, world_size, world_size - 1);
        }
        return;   // the server holds it back (DPConfig.held, llmc/parallel/dp_ps_async.h)
    }
    st->ms = atof(c + 1);
    st->rank = strncmp(s, "random:", 7) == 0 ? -1 : atoi(s);
    if (st->rank >= world_size) {
        die("--straggler %s: there are only %d ranks (0 to %d): name one of them, or random:%s", s, world_size,
            world_size - 1, c + 1);
    }
}

// The straggler of step `step` (from 0): the named rank, or with random:MS one rank drawn from
// --seed and the step, so that every rank draws the same one without talking (and a worker
// ahead of the others, without a barrier, still agrees on who straggles at each step)
static inline int straggler_at(const Straggler* st, int step) {
    if (st->rank != -1) { return st->rank; }
    uint64_t x = (uint64_t)(uint32_t)st->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step + 1;   // splitmix64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (int)(x % (uint64_t)st->world_size);
}

// At the start of step `step` (from 0): this rank sleeps when it is the step's straggler
static inline void straggler_delay(const Straggler* st, int step) {
    if (st->rank >= -1 && straggler_at(st, step) == st->me) { usleep((useconds_t)(st->ms * 1000.0)); }
}
