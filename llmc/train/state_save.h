// Saving the training state (what it holds and the directory's layout: llmc/train/train_state.h).
// Collective and all or nothing, in four steps (train_state_save):
//   1. state_save_begin        rank 0 makes DIR/step-K.tmp (removing what saves that crashed
//                              left there) and tells every rank which state a failure keeps
//   2. state_rank_file_write   every rank writes its file into it
//   3. state_save_agree        if any write failed (a full disk), the directory is removed and
//                              every rank stops, the previous state untouched
//   4. state_publish           rank 0 writes the position, the log, the metrics and last the
//                              manifest, renames the directory to DIR/step-K, points DIR/latest
//                              at it (temporary file + rename), and only then removes the
//                              previous step's directory
// A crash at any moment leaves DIR/latest naming a complete state.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../tasks/task.h"
#include "../plan/parallel_plan.h"
#include "train_state.h"
#include "state_files.h"
#include "state_manifest.h"
#include "state_shards.h"

// One save: DIR, the step's directory and its temporary twin, and the step of the state DIR
// held before (-1: none), the one a failed save keeps
typedef struct {
    std::string dir, name, final_dir, tmp_dir;
    int step, previous;
    uint64_t identity;   // the run's (TrainState.identity)
} StateSave;

// What a failed save leaves in DIR: the previous state (the step latest names), or none
static inline std::string state_kept(const std::string& dir, int previous) {
    char buf[64];
    if (previous < 0) { return "no state was saved in '" + dir + "' (it held none before)"; }
    snprintf(buf, sizeof(buf), "' keeps the previous state, step-%08d", previous);
    return "'" + dir + buf;
}

// 1. Rank 0 makes the directories, and tells every rank which state a failed save keeps
// (s->previous). Collective.
static inline void state_save_begin(StateSave* s, const Plan* plan) {
    const std::string& dir = s->dir;
    int ok = 1, previous = -1;
    std::string err, latest = dir + "/latest";
    if (plan->rank == 0) {
        if (access(latest.c_str(), F_OK) == 0) { previous = state_latest_step(read_text_or_die(latest)); }
        if (!is_dir(dir) && mkdir(dir.c_str(), 0755) != 0) { err = "cannot create '" + dir + "': " + strerror(errno); }
        if (DIR* d = opendir(dir.c_str())) {   // step-*.tmp: left by saves that crashed (never published)
            std::vector<std::string> stale;
            while (struct dirent* e = readdir(d)) {
                std::string n = e->d_name;
                if (n.compare(0, 5, "step-") == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) { stale.push_back(n); }
            }
            closedir(d);
            for (const std::string& n : stale) { remove_flat_dir(dir + "/" + n); }
        }
        if (err.empty() && mkdir(s->tmp_dir.c_str(), 0755) != 0) { err = "cannot create '" + s->tmp_dir + "': " + strerror(errno); }
        ok = err.empty();
    }
    int told[2] = {ok, previous};
    MPI_Bcast(told, 2, MPI_INT, 0, plan->world.mpi);
    s->previous = told[1];
    if (!told[0]) {
        if (plan->rank == 0) { die("saving the training state: %s", err.c_str()); }
        die("saving the training state failed on rank 0");
    }
}

// 2. This rank's file: the header, the runs of the segments it writes, then their values, kind
// after kind. Collective (whether any rank has master weights, returned). *w: the file's size
// and CRC-32, or its error.
static inline int state_rank_file_write(const StateSave* s, Plan* plan, StateWriter* w) {
    GPT2* m = plan->model;
    std::vector<StateSegment> segs = state_segments(plan);
    std::vector<StateRun> runs;
    std::vector<const StateSegment*> mine;
    std::vector<size_t> real;   // of each segment of mine: the first `real` values have runs (the rest: vocab padding)
    for (const StateSegment& g : segs) {
        if (!g.write) { continue; }
        mine.push_back(&g);
        real.push_back(tensor_full_runs(m, g.s.tensor, g.s.flat - m->param_info[g.s.tensor].offset, g.s.n, &runs));
    }
    int has_master = 0;
    for (const StateSegment& g : segs) { has_master |= g.s.master != NULL; }
    MPI_Allreduce(MPI_IN_PLACE, &has_master, 1, MPI_INT, MPI_MAX, plan->world.mpi);   // ranks with no segment (PS workers) too
    uint64_t nvalues = 0;
    for (const StateRun& r : runs) { nvalues += r.n; }
    int64_t header[8] = {TRAIN_STATE_MAGIC, TRAIN_STATE_FORMAT, plan->rank, plan->world_size, has_master, (int64_t)runs.size(),
                         (int64_t)nvalues, (int64_t)s->identity};
    char fname[32];
    snprintf(fname, sizeof(fname), "rank-%05d.bin", plan->rank);
    sw_open(w, s->tmp_dir + "/" + fname);
    sw_write(w, header, sizeof(header));
    sw_write(w, runs.data(), runs.size() * sizeof(StateRun));
    std::vector<float> host;
    for (int kind = 0; kind < TRAIN_STATE_KINDS; kind++) {
        if (kind == KIND_MASTER && !has_master) { continue; }
        for (size_t j = 0; j < mine.size(); j++) {
            const StateSegment* g = mine[j];
            host.resize(g->s.n);
            // a segment without master weights beside ones with them (fp32 experts next to the offloaded
            // dense part): its parameters are its fp32 master weights
            state_segment_get(g, kind == KIND_MASTER && !g->s.master ? KIND_PARAMS : kind, host.data());
            sw_write(w, host.data(), real[j] * sizeof(float));
        }
    }
    sw_close(w);
    return has_master;
}

// 3. All or nothing: one failed write removes the directory and stops every rank. Else rank 0
// gets every rank file's size and CRC-32 (rank order), for the manifest. Collective.
static inline std::vector<unsigned long long> state_save_agree(const StateSave* s, const Plan* plan, const StateWriter* w) {
    MPI_Comm world = plan->world.mpi;
    int ok = w->err.empty(), all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, world);
    if (!all_ok) {
        MPI_Barrier(world);   // every rank's file closed (and removed where it failed)
        if (plan->rank == 0) { remove_flat_dir(s->tmp_dir); }
        MPI_Barrier(world);
        if (!ok) { die("saving the training state: %s; %s", w->err.c_str(), state_kept(s->dir, s->previous).c_str()); }
        die("saving the training state failed on another rank (see its message); %s", state_kept(s->dir, s->previous).c_str());
    }
    unsigned long long mine_info[2] = {w->bytes, w->hash};
    std::vector<unsigned long long> files(2 * (size_t)plan->world_size);
    MPI_Gather(mine_info, 2, MPI_UNSIGNED_LONG_LONG, files.data(), 2, MPI_UNSIGNED_LONG_LONG, 0, world);
    return files;
}

// The position file: where the run stands, read back by train_state_init
static inline std::string state_position_text(const TrainState* ts, int step, const Rng* sample_rng) {
    Position pos;
    position_put(&pos, "trainer.step", (unsigned long long)step);   // (checked against the manifest's on resume)
    position_put(&pos, "trainer.identity", (unsigned long long)ts->identity);   // (and this)
    position_put(&pos, "trainer.sample_rng", sample_rng->state);
    position_put(&pos, "trainer.heldout_bits", (uint32_t)float_bits(ts->task->heldout));   // not yet reported (NaN: none)
    if (ts->scaler->on) {
        position_put(&pos, "trainer.loss_scale_bits", (uint32_t)float_bits(ts->scaler->scale));
        position_put(&pos, "trainer.loss_scale_clean", (unsigned long long)ts->scaler->clean);
        position_put(&pos, "trainer.loss_scale_skipped", (unsigned long long)ts->scaler->skipped);
    }
    ts->task->get_position(ts->task, &pos);
    std::string text;
    for (auto& kv : pos) { text += kv.first + " " + kv.second + "\n"; }
    return text;
}

// 4. Rank 0: the position, log, metrics and manifest files (texts, in that order: the manifest
// last) into the .tmp directory, then published under DIR/latest; the previous state removed.
static inline void state_publish(const StateSave* s, const std::string* const texts[4]) {
    const char* names[4] = {"position", "log", "metrics", "manifest"};
    std::string err, latest = s->dir + "/latest";
    StateWriter w;
    for (int i = 0; i < 4 && err.empty(); i++) {
        sw_open(&w, s->tmp_dir + "/" + names[i]);
        sw_write(&w, texts[i]->data(), texts[i]->size());
        if (!sw_close(&w)) { err = w.err; }
    }
    if (err.empty()) {
        remove_flat_dir(s->final_dir);   // the same step saved again (a resumed run)
        if (rename(s->tmp_dir.c_str(), s->final_dir.c_str()) != 0) { err = "cannot rename '" + s->tmp_dir + "': " + strerror(errno); }
    }
    if (err.empty()) {
        sw_open(&w, latest + ".tmp");
        std::string line = s->name + "\n";
        sw_write(&w, line.c_str(), line.size());
        if (!sw_close(&w)) { err = w.err; }
        else if (rename((latest + ".tmp").c_str(), latest.c_str()) != 0) {
            err = "cannot rename '" + latest + ".tmp': " + strerror(errno);
            unlink((latest + ".tmp").c_str());
        }
    }
    if (!err.empty()) {
        remove_flat_dir(s->tmp_dir);
        if (s->previous != s->step) { remove_flat_dir(s->final_dir); }
        die("saving the training state: %s; %s", err.c_str(), state_kept(s->dir, s->previous).c_str());
    }
    if (s->previous >= 0 && s->previous != s->step) {   // (latest named a step directory: nothing else is ever removed)
        char old[32];
        snprintf(old, sizeof(old), "step-%08d", s->previous);
        remove_flat_dir(s->dir + "/" + old);
    }
}

// The line a save prints: its size against what the parameters alone take
static inline void state_save_print(const StateSave* s, const Plan* plan, int has_master, const std::vector<unsigned long long>& files,
                                    double seconds) {
    const GPT2* m = plan->model;
    int nranks = plan->world_size;
    unsigned long long total = 0;
    for (int r = 0; r < nranks; r++) { total += files[2 * r]; }
    // each parameter once: 4 bytes of parameters, m, v (and master weights): K = 12 or 16 bytes
    unsigned long long K = 4ull * (3 + has_master), payload = K * m->num_parameters_full;
    printf("saved state  %s (step %d, %d rank files, %.2f MiB = %llu bytes x %zu parameters + %.1f KiB of headers "
           "and index, %.0f ms)\n", s->final_dir.c_str(), s->step, nranks, total / 1048576.0, K, m->num_parameters_full,
           (double)(total - payload) / 1024.0, seconds * 1e3);
}

// The state after `step` updates into DIR/step-K (--save-state DIR). Collective.
static inline void train_state_save(TrainState* ts, int step, const Rng* sample_rng) {
    Plan* plan = ts->plan;
    double t0 = wall_seconds();
    StateSave s;
    char name[32];
    snprintf(name, sizeof(name), "step-%08d", step);
    s.dir = ts->args->save_state;
    s.name = name;
    s.final_dir = s.dir + "/" + name;
    s.tmp_dir = s.final_dir + ".tmp";
    s.step = step;
    s.identity = ts->identity;
    state_save_begin(&s, plan);
    StateWriter w;
    int has_master = state_rank_file_write(&s, plan, &w);
    std::vector<unsigned long long> files = state_save_agree(&s, plan, &w);
    if (plan->rank == 0) {
        std::string position = state_position_text(ts, step, sample_rng), metrics;
        if (ts->task->metrics) {   // the --metrics CSV so far (rlvr), continued by a resumed run
            fflush(ts->task->metrics);
            metrics = read_text_or_die(ts->task->metrics_tmp);
        }
        const std::string* small[3] = {&position, &ts->log, &metrics};
        std::string manifest = manifest_text(plan, ts->args, step, has_master, ts->identity, files, small);
        const std::string* texts[4] = {&position, &ts->log, &metrics, &manifest};
        state_publish(&s, texts);
        state_save_print(&s, plan, has_master, files, wall_seconds() - t0);
    }
    MPI_Barrier(plan->world.mpi);
}
