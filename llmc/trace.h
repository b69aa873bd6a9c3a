// --trace FILE.json: Chrome trace events ("X" events: name, start, duration) that Perfetto
// (ui.perfetto.dev) or chrome://tracing opens. One process per rank, one thread (track) per
// stream of work: track 0 is compute (the main thread), track 1 is communication (the DP
// communication thread, llmc/parallel/dp.h), track 2 the tensor-parallel collectives (run by the
// main thread, llmc/parallel/tp.h: they never overlap compute), track 3 the pipeline's sends and
// receives (llmc/parallel/pp.h; its F/B/W actions are on track 0, so each rank's compute track is
// its stage's row of the schedule's timeline), track 4 context parallelism's exchanges
// (llmc/parallel/cp_core.h), track 5 expert parallelism's all-to-alls (llmc/parallel/ep.h).
// Where the bars of tracks 0 and 1 overlap in time,
// communication is hidden behind compute.
//
// Each rank records into memory; at the end rank 0 collects every rank's events and writes one
// file (trace_write). Timestamps are microseconds since a barrier all ranks passed together.
#pragma once

#include <mutex>
#include <string>
#include <vector>
#include "common.h"
#include "profile.h"   // --profile counts the compute thread's communication too

typedef struct {
    std::string name;
    int track;
    double start_us, dur_us;
} TraceEvent;

typedef struct {
    int enabled;
    double t0;                       // wall_seconds() at trace_start
    std::vector<TraceEvent> events;
    std::mutex lock;                 // the compute and communication threads both record
} Trace;

static Trace g_trace;
static const char* TRACE_TRACK_NAMES[6] = {"compute", "communication", "tensor-parallel communication",
                                          "pipeline sends and receives", "context-parallel exchanges",
                                          "expert-parallel all-to-all"};

static inline void trace_start(void) {
    g_trace.enabled = 1;
    g_trace.t0 = wall_seconds();
}

static inline double trace_now(void) { return wall_seconds(); }

// Record an event that began at `start` (a trace_now() value) and ends now.
static inline void trace_event(const char* name, int track, double start) {
    static const char* profile_names[6] = {"", "", "tp collectives", "pp send/recv", "cp exchanges", "ep all-to-all"};
    if (track >= 2) { profile_communication(profile_names[track], wall_seconds() - start); }
    if (!g_trace.enabled) { return; }
    double end = wall_seconds();
    std::lock_guard<std::mutex> guard(g_trace.lock);
    g_trace.events.push_back({name, track, (start - g_trace.t0) * 1e6, (end - start) * 1e6});
}

// This rank's events as JSON objects, comma-separated (pid = rank, tid = track).
static inline std::string trace_json_events(int rank) {
    std::string out;
    char buf[512];
    for (int t = 0; t < 6; t++) {
        snprintf(buf, sizeof(buf), "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n",
                 rank, t, TRACE_TRACK_NAMES[t]);
        out += buf;
    }
    snprintf(buf, sizeof(buf), "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank, rank);
    out += buf;
    for (const TraceEvent& e : g_trace.events) {
        snprintf(buf, sizeof(buf), ",\n{\"ph\":\"X\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.1f,\"dur\":%.1f}",
                 e.name.c_str(), rank, e.track, e.start_us, e.dur_us);
        out += buf;
    }
    return out;
}

// Write the file from the per-rank JSON fragments (rank 0 calls this after gathering them).
static inline void trace_write_file(const char* path, const std::vector<std::string>& per_rank) {
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    fprintf(f, "{\"traceEvents\":[\n");
    for (size_t r = 0; r < per_rank.size(); r++) {
        fprintf(f, "%s%s\n", r ? ",\n" : "", per_rank[r].c_str());
    }
    fprintf(f, "],\"displayTimeUnit\":\"ms\"}\n");
    fclose_and_rename(f, tmp, path);
}
