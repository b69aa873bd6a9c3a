// --profile on the CUDA backend: the time of each operation's scope (llmc/profile.h) from a pair of
// CUDA events. A kernel launch returns before the kernel runs, so the host's clock around the call
// would time the launch, not the work; instead the scope records an event on the stream the kernels
// run on (the legacy default stream, common.cuh) when it opens and another when it closes, and the
// GPU stamps each when it gets there. At the end of each recorded step profile_timers_collect waits
// for the last one and adds each pair's elapsed time to its row.
//
// The events come from a pool: created the first time a step needs that many (two per scope), kept
// and reused by the following steps, never created or destroyed in the steady state. Only the
// outermost scope records (the recorder's depth), so the pairs of a step never overlap and their
// sum is at most the step's time.
//
// Under the CPU emulator (dev/emu) the same events are used: it stamps an event with the host's
// clock when the queued work before it has run, so the figures are the emulator's time per
// operation, consistent with the step's, and say nothing about a GPU.
//
// Included by llmc/profile.h in CUDA builds, which llmc/cuda/common.cuh includes after cudaCheck.
#pragma once

#include <stdlib.h>
#include <cuda_runtime.h>

#ifndef cudaCheck
#error "llmc/profile_events.cuh needs cudaCheck: include llmc/cuda/common.cuh (it includes llmc/profile.h) first"
#endif

typedef struct {
    cudaEvent_t* events;   // 2 per pair: start, end
    int* rows;             // the row of the table each pair's time goes to
    int capacity;          // pairs the pool holds
    int used;              // pairs recorded in this step
} ProfileEvents;
static ProfileEvents g_profile_events;

// records the start of a scope; returns the pair's index (the recorder keeps it in its t0)
static inline double profile_timer_begin() {
    ProfileEvents* p = &g_profile_events;
    if (p->used == p->capacity) {   // the first recorded step: the pool grows to the step's size
        int cap = p->capacity > 0 ? 2 * p->capacity : 256;
        p->events = (cudaEvent_t*)realloc(p->events, 2 * (size_t)cap * sizeof(cudaEvent_t));
        p->rows = (int*)realloc(p->rows, (size_t)cap * sizeof(int));
        if (p->events == NULL || p->rows == NULL) { die("--profile: out of host memory for %d event pairs", cap); }
        for (int i = 2 * p->capacity; i < 2 * cap; i++) { cudaCheck(cudaEventCreate(&p->events[i])); }
        p->capacity = cap;
    }
    int k = p->used++;
    cudaCheck(cudaEventRecord(p->events[2 * k], 0));
    return (double)k;
}

// records the end of the scope that profile_timer_begin numbered t0
static inline void profile_timer_end(int row, double t0) {
    ProfileEvents* p = &g_profile_events;
    int k = (int)t0;
    p->rows[k] = row;
    cudaCheck(cudaEventRecord(p->events[2 * k + 1], 0));
}

// at the end of a recorded step: wait for the last event, add every pair's time to its row, and
// hand the events back to the pool for the next step
static inline void profile_timers_collect() {
    ProfileEvents* p = &g_profile_events;
    if (p->used == 0) { return; }
    cudaCheck(cudaEventSynchronize(p->events[2 * p->used - 1]));   // one stream: the earlier ones are done too
    for (int k = 0; k < p->used; k++) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, p->events[2 * k], p->events[2 * k + 1]));
        g_profile.rows[p->rows[k]].seconds += 1e-3 * (double)ms;
    }
    p->used = 0;
}
