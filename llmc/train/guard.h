// What the trainer does when something goes wrong, so that a run ends with one clear
// line instead of a hang, a half-written file or a silent NaN (doc/errors.md lists the messages):
//   guard_init           after plan_init: SIGXFSZ ignored (a write past the file-size limit then
//                        fails with EFBIG and is reported, instead of killing the process
//                        silently), SIGTERM/SIGINT/SIGHUP/SIGPIPE remove the temporary files first,
//                        --save-state's lock taken (llmc/train/state_lock.h; guard_free releases
//                        it), and with --comm-timeout the watchdog started
//   (the output paths, checked before any work, are llmc/train/outputs.h's)
//   guard_dloss          at each step's start: the progress mark, and --on-nan skip handed to
//                        the model
//   guard_step_end       after the update: a non-finite loss or gradient norm stops the run,
//                        naming the step and the first tensor whose gradient is not finite
//                        (--on-nan stop), or skips the step's update (--on-nan skip)
//
// The watchdog (--comm-timeout T): a rank that DIES ends the job by itself (mpirun ends the other
// ranks within a second); a rank that HANGS would leave the others waiting in a collective
// forever. Each rank runs a watchdog thread. The main thread marks its progress at each step's
// start and end (it started step s, it ended step s), and inside a step at each of the model's
// hook events (a micro-batch starts, a block's forward or backward begins: the model's chain
// counts them, llmc/model/hooks.h's HookProgress); when the main threads have not moved for T
// seconds, one watchdog ends the job with one line naming the rank that stopped answering. To
// know which one, the watchdogs send each other their rank's last mark, event count and event every 0.25 s
// (non-blocking sends and receives on a communicator of their own, polled with MPI_Test, so a
// frozen peer never blocks them). The hung rank is the one behind the others: in an earlier step
// (it ended step s and never started step s+1, where the others wait for it), or in the same step
// with fewer hook events (it stopped in block l's backward while the others went on to the
// gradient all-reduce) - without a pipeline every rank raises the same events in the same order,
// so their counts compare; pipeline stages run different passes, and only steps compare there. Or
// it is the one whose heartbeats stopped (the whole process is frozen). A rank that hangs at the
// same event as the others (inside a collective they all entered) cannot be told from the ones
// waiting for it, and the line says so. One verdict for the job (llmc/train/watchdog.h): the lowest rank
// the verdict does not name, of those waiting too, prints it; the others, which mostly reach the
// same one, stay silent while mpirun ends them; a rank that was itself stopped (SIGSTOP: it gets SIGCONT, or its watchdog
// looks late) accuses no one; a rank whose heartbeats stopped during the wait stays the frozen one
// even if they come back. T must exceed the longest time between two marks (a block's forward or
// backward, an evaluation, a sample, a save). The watchdog is armed at the first step and stops
// after the last (the final evaluation and saves are not watched).
//
// Two things the tests and the labs inject plug in at the step's start (guard_dloss), each in a
// file of its own: the faults of --fault (llmc/train/fault_injection.h) and the slow worker of
// --straggler (llmc/train/straggler.h).
#pragma once

#include <signal.h>
#include <math.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <thread>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../plan/train_args.h"
#include "../plan/parallel_plan.h"
#include "watchdog.h"
#include "fault_injection.h"
#include "straggler.h"
#include "state_lock.h"

typedef struct Guard {
    const TrainArgs* args;
    Plan* plan;
    int rank, world_size;
    Fault fault;                   // --fault (tests only)
    Straggler straggler;           // --straggler
    // progress of the main thread: 0 before the first step, 2s+1 in step s, 2s+2 after it (s from 0)
    std::atomic<long long> mark{0};
    // inside a step: the model's hook events since the step's start mark, the last one and when
    // (the passes write it: llmc/model/hooks.h, HookProgress; the marks reset it)
    HookProgress progress;
    int hooked;                    // the model's chain writes progress
    // the watchdog
    double timeout;                // --comm-timeout (0: none)
    std::thread thread;
    std::atomic<int> stop{0};
    int heartbeats;                // 1: the watchdogs exchange marks on hb (several ranks, the MPI build)
    MPI_Comm hb;
} Guard;

// ---------------------------------------------------------------------------------------
// The watchdog

#define GUARD_TAG 7321   // the heartbeats' tag on the guard's own communicator

// "at the end of step 3", "in step 4", "before step 1" (steps printed from 1)
static inline std::string guard_mark_name(long long mark) {
    char buf[64];
    if (mark <= 0) { snprintf(buf, sizeof(buf), "before step 1"); }
    else if (mark % 2 == 1) { snprintf(buf, sizeof(buf), "in step %lld", (mark + 1) / 2); }
    else { snprintf(buf, sizeof(buf), "at the end of step %lld", mark / 2); }
    return buf;
}

// The verdict once this rank made no progress for the timeout: which rank stopped answering,
// from the marks of every rank (marks[r]) and the time since each was last heard of (quiet[r]).
// "the backward of block 3 (micro-batch 2)": the last hook event (HookProgress.where)
static inline std::string guard_where_name(long long where) {
    int kind = (int)(where >> 32), micro = (int)((where >> 16) & 0xFFFF), l = (int)(where & 0xFFFF);
    char buf[96];
    switch (kind) {
        case HOOK_MICRO: snprintf(buf, sizeof(buf), "the start of micro-batch %d", micro + 1); break;
        case HOOK_FORWARD: snprintf(buf, sizeof(buf), "the forward's start (micro-batch %d)", micro + 1); break;
        case HOOK_BLOCK_FORWARD: snprintf(buf, sizeof(buf), "the forward of block %d (micro-batch %d)", l, micro + 1); break;
        case HOOK_BACKWARD: snprintf(buf, sizeof(buf), "the backward's start (micro-batch %d)", micro + 1); break;
        case HOOK_BLOCK_BACKWARD: snprintf(buf, sizeof(buf), "the backward of block %d (micro-batch %d)", l, micro + 1); break;
        case HOOK_BACKWARD_END: snprintf(buf, sizeof(buf), "the backward's end (micro-batch %d)", micro + 1); break;
        default: snprintf(buf, sizeof(buf), "the step's start"); break;
    }
    return buf;
}

// marks[r] = the last heartbeat of rank r; quiet[r] = how long it was silent; *named: the ranks the verdict names
static inline std::string guard_verdict(const Guard* g, const std::vector<Heartbeat>& marks, const std::vector<double>& quiet,
                                        double silent_after, std::vector<int>* named) {
    int n = g->world_size;
    if (n == 1) { named->push_back(0); return "the run's only rank stopped " + guard_mark_name(marks[0][0]); }
    std::string who, why;
    int count = 0;
    for (int r = 0; r < n; r++) {   // heartbeats stopped: the whole process is frozen (or gone)
        if (quiet[r] > silent_after) {
            who += (count++ ? ", " : "") + std::to_string(r);
            named->push_back(r);
            why = "no heartbeat for " + std::to_string((int)quiet[r]) + " s: the process is frozen or gone; last seen " +
                  guard_mark_name(marks[r][0]);
        }
    }
    if (count == 0) {   // the rank(s) behind the others: by step, then (the same step) by hook events
        long long lo = marks[0][0], hi = marks[0][0];
        for (int r = 1; r < n; r++) { lo = std::min(lo, marks[r][0]); hi = std::max(hi, marks[r][0]); }
        if (lo != hi) {
            for (int r = 0; r < n; r++) {
                if (marks[r][0] == lo) { who += (count++ ? ", " : "") + std::to_string(r); named->push_back(r); }
            }
            why = "last seen " + guard_mark_name(lo) + "; it is not in a communication call: the other ranks are " +
                  guard_mark_name(hi) + ", waiting for it";
        } else {
            // Every rank is in the same step. Without a pipeline every rank raises the same hook
            // events in the same order (the same passes over its own data or shard), so the one
            // with the fewest has stopped where the others went on; pipeline stages run different
            // passes, whose counts do not compare.
            long long elo = marks[0][1], ehi = marks[0][1];
            for (int r = 1; r < n; r++) { elo = std::min(elo, marks[r][1]); ehi = std::max(ehi, marks[r][1]); }
            if (g->plan->npp > 1 || elo == ehi) {
                return "every rank is " + guard_mark_name(lo) +
                       (g->plan->npp > 1 ? " (pipeline stages run different passes)" : ", at the same point of its passes,") +
                       " and still answers heartbeats: a communication of that step never completed, and the rank that "
                       "hangs inside it cannot be told from those waiting for it";
            }
            int rhi = 0;
            for (int r = 0; r < n; r++) {
                if (marks[r][1] == elo) { who += (count++ ? ", " : "") + std::to_string(r); named->push_back(r); }
                if (marks[r][1] == ehi) { rhi = r; }
            }
            int rlo = atoi(who.c_str());
            why = "last seen " + guard_mark_name(lo) + " at " + guard_where_name(marks[rlo][2]) + "; the others went on to " +
                  guard_where_name(marks[rhi][2]) + " and wait for it";
        }
    }
    return std::string(count > 1 ? "ranks " : "rank ") + who + " stopped answering (" + why + ")";
}

static inline void guard_watchdog(Guard* g) {
    const double poll = 0.05;
    int me = g->rank, n = g->world_size;
    std::vector<Heartbeat> peer(n, Heartbeat{}), sendbuf(n, Heartbeat{}), recvbuf(n, Heartbeat{});
    Watch w;   // when each rank was last heard, whether this one was stopped, who speaks (llmc/train/watchdog.h)
    watch_init(&w, n, g->timeout, wall_seconds());
#ifdef USE_MPI
    const double beat = 0.25;
    double last_beat = -1.0;
    std::vector<MPI_Request> sreq(n, MPI_REQUEST_NULL), rreq(n, MPI_REQUEST_NULL);
    auto send_beats = [&](const Heartbeat& h) {   // to every peer (skip a peer whose last one is still out)
        for (int p = 0; p < n; p++) {
            int done = 1;
            if (p == me) { continue; }
            if (sreq[p] != MPI_REQUEST_NULL) { MPI_Test(&sreq[p], &done, MPI_STATUS_IGNORE); }
            if (!done) { continue; }
            sendbuf[p] = h;
            MPI_Isend(sendbuf[p].data(), 4, MPI_LONG_LONG, p, GUARD_TAG, g->hb, &sreq[p]);
        }
    };
    if (g->heartbeats) {
        for (int p = 0; p < n; p++) {
            if (p != me) { MPI_Irecv(recvbuf[p].data(), 4, MPI_LONG_LONG, p, GUARD_TAG, g->hb, &rreq[p]); }
        }
    }
#endif
    while (!g->stop.load()) {
        double now = wall_seconds();
        watch_look(&w, now);   // this process was stopped since the last look: what it measured starts again
        double since = watch_since(&w, g->progress.at.load());
        Heartbeat now_mark = {g->mark.load(), g->progress.events.load(), g->progress.where.load(), 0};
        long long mine = now_mark[0];
        double idle = now - since;
        if (mine > 0 && idle > g->timeout / 2) { now_mark[3] = WATCH_WAITING; }   // it may speak (watch_speaker)
#ifdef USE_MPI
        if (g->heartbeats) {
            if (now - last_beat >= beat) {
                send_beats(now_mark);
                last_beat = now;
            }
            for (int p = 0; p < n; p++) {   // take every heartbeat that has arrived
                if (p == me) { continue; }
                for (;;) {
                    int done = 0;
                    MPI_Test(&rreq[p], &done, MPI_STATUS_IGNORE);
                    if (!done) { break; }
                    if (!watch_heard(&w, p, recvbuf[p][3], now, since)) { peer[p] = recvbuf[p]; }   // frozen in this wait: the mark from before
                    MPI_Irecv(recvbuf[p].data(), 4, MPI_LONG_LONG, p, GUARD_TAG, g->hb, &rreq[p]);
                }
            }
        }
#endif
        if (mine <= 0 || idle <= g->timeout) {
            w.decided_at = 0.0;
        } else if (!watch_unsure(&w, me, now)) {   // no progress for the timeout, and every rank either heard or long silent
            std::vector<Heartbeat> marks(peer);
            std::vector<double> quiet(n, 0.0);
            std::vector<int> named;
            marks[me] = now_mark;
            for (int p = 0; p < n; p++) { quiet[p] = p == me ? 0.0 : watch_silence(&w, p, now, since); }
            std::string verdict = guard_verdict(g, marks, quiet, w.silent_after, &named);
            if (w.decided_at == 0.0) { w.decided_at = now; }
            int speaks = !w.spoke && watch_speaker(&w, named, me) == me;   // once a rank spoke, no other does
            if (!speaks && now - w.decided_at > w.grace) {   // the job should have ended by now
                if (w.spoke) { tmp_file_remove_all(); exit(1); }   // a rank spoke, mpirun is slow: end without a word
                speaks = 1;                                        // the rank that should speak is stuck: this one does
            }
            if (speaks) {
#ifdef USE_MPI
                if (g->heartbeats) {   // tell the others first (small sends, gone at once; wait at most 0.2 s)
                    Heartbeat last = now_mark;
                    last[3] |= WATCH_SPOKE;
                    send_beats(last);
                    for (int i = 0, done = 0; i < 40 && !done; i++) {
                        MPI_Testall(n, sreq.data(), &done, MPI_STATUSES_IGNORE);
                        if (!done) { struct timespec ts = {0, 5000000}; nanosleep(&ts, NULL); }
                    }
                }
#endif
                die("no progress for %.0f s (--comm-timeout %g): %s", idle, g->timeout, verdict.c_str());
            }
        }
        struct timespec ts = {0, (long)(poll * 1e9)};
        nanosleep(&ts, NULL);
    }
#ifdef USE_MPI
    if (g->heartbeats) {   // leave nothing pending: receives cancelled, sends finished (they are small: sent eagerly)
        send_beats(Heartbeat{g->mark.load(), g->progress.events.load(), g->progress.where.load(), WATCH_DONE});   // a last one: done, not frozen
        for (int p = 0; p < n; p++) {
            if (p == me) { continue; }
            MPI_Cancel(&rreq[p]);
            MPI_Wait(&rreq[p], MPI_STATUS_IGNORE);
            for (int i = 0; i < 200 && sreq[p] != MPI_REQUEST_NULL; i++) {
                int done = 0;
                MPI_Test(&sreq[p], &done, MPI_STATUS_IGNORE);
                if (!done) { struct timespec ts = {0, 5000000}; nanosleep(&ts, NULL); }
            }
        }
    }
#endif
}

// The main thread's progress: at each step's start and end
static inline void guard_mark(Guard* g, long long mark) {
    g->progress.events.store(0);
    g->progress.where.store(0);
    g->plan->model->hooks.micro = 0;
    g->progress.at.store(wall_seconds());
    g->mark.store(mark);
}

// ---- the model's hook events: progress inside a step (the timeout then bounds the time between
// two events, a block's forward or backward, not a whole step), and where a rank stopped: the
// model's chain writes them into g->progress from the first step on
static inline void guard_hooks(Guard* g) {
    if (g->hooked || g->timeout <= 0) { return; }
    g->plan->model->hooks.progress = &g->progress;
    g->hooked = 1;
}

// The watchdog stops (after the run's last step, and at the end): idempotent
static inline void guard_stop(Guard* g) {
    if (!g->thread.joinable()) { return; }
    g->stop.store(1);
    g->thread.join();
}
static inline void guard_free(Guard* g) {
    guard_stop(g);
    if (g->args->save_state && g->rank == 0) { state_lock_release(g->args->save_state); }   // the run succeeded
}

// ---------------------------------------------------------------------------------------
// Set-up

// After plan_init, on every rank (collective: the watchdogs' communicator is made here).
static inline void guard_init(Guard* g, const TrainArgs* args, Plan* plan) {
    signal(SIGXFSZ, SIG_IGN);   // past the file-size limit: write fails with EFBIG, and we say so
    // ended from outside: mpirun ends the other ranks with SIGTERM, and rank 0, which prints, may meet
    // the closed pipe of its stdout first (SIGPIPE); no .tmp is left either way
    int ends[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE};
    for (int sig : ends) { signal(sig, tmp_file_signal_handler); }
    if (args->save_state && plan->rank == 0) { state_lock_take(args->save_state); }   // one job per state directory
    g->args = args;
    g->plan = plan;
    g->rank = plan->rank;
    g->world_size = plan->world_size;
    fault_parse(&g->fault, args->fault, g->rank, g->world_size);
    straggler_parse(&g->straggler, args->straggler, g->rank, g->world_size, args->seed);
    g->mark.store(0);
    g->progress.events.store(0);
    g->progress.where.store(0);
    g->hooked = 0;
    g->progress.at.store(wall_seconds());
    g->timeout = args->comm_timeout;
    g->heartbeats = 0;
    g->hb = MPI_COMM_NULL;
    g->stop.store(0);
    if (g->timeout <= 0) { return; }
    struct sigaction cont = {};   // the watchdog's witness that this process was stopped (llmc/train/watchdog.h)
    cont.sa_handler = watch_on_sigcont;
    cont.sa_flags = SA_RESTART;
    sigaction(SIGCONT, &cont, NULL);
#ifdef USE_MPI
    if (g->world_size > 1) {
        MPI_Comm_dup(MPI_COMM_WORLD, &g->hb);   // the heartbeats never meet the run's messages
        g->heartbeats = 1;
    }
#endif
    g->thread = std::thread(guard_watchdog, g);
}

// ---------------------------------------------------------------------------------------
// Each step

// At the start of step `step` (from 0), with the dloss the task returned: the progress mark and
// the --on-nan choice handed to the model's update. Returns the dloss.
static inline float guard_dloss(Guard* g, int step, float dloss) {
    fault_step_begins(&g->fault, g->plan->model, step);   // --fault: kill or hang here (tests only)
    guard_hooks(g);
    guard_mark(g, 2LL * step + 1);
    straggler_delay(&g->straggler, step);   // --straggler: this rank may be slow this step
    g->plan->model->skip_nonfinite = strcmp(g->args->on_nan, "skip") == 0;
    return fault_dloss(&g->fault, step, dloss);   // --fault nan: a NaN dloss (tests only)
}

// The first gradient (in the parameter table's order; for a per-layer tensor, the first layer)
// that holds a NaN or an inf, over every rank: a tensor's piece is judged by its sum of squares,
// so a finite value whose square overflows counts too (it is what made the norm overflow).
// Collective over the world. "wte", "qkvw (layer 3)", or "" when every gradient is finite.
static inline std::string guard_first_nonfinite(Plan* plan) {
    GPT2* m = plan->model;
    const int LAYERS = 1000000;   // key = tensor * LAYERS + layer + 1 (0 for a tensor without layers)
    int first = INT32_MAX;
    std::vector<OptSegment> segs = plan_opt_segments(plan);   // what this rank holds: its ZeRO shard, its stage, its experts
    for (const OptSegment& s : segs) {
        const ParamInfo* p = &m->param_info[s.tensor];
        size_t per = p->layered ? p->numel / (size_t)p->shape[0] : s.n;   // elements of one layer's slice
        size_t at = s.flat - p->offset;                                     // where the segment starts in the tensor
        for (size_t done = 0; done < s.n;) {
            size_t slice = (at + done) / per, len = std::min(s.n - done, (slice + 1) * per - (at + done));
            float sq;
            global_norm_squared(m->norm_squared, s.grad + done, len);
            copy_device_to_host(&sq, m->norm_squared, sizeof(float));
            if (!isfinite(sq)) {
                int layer = p->layered ? param_slice_block(p, &m->place, (int)slice) + 1 : 0;
                first = std::min(first, s.tensor * LAYERS + layer);
            }
            done += len;
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, plan->world.mpi);
    if (first == INT32_MAX) { return ""; }
    std::string name = m->param_info[first / LAYERS].name;
    if (first % LAYERS > 0) { name += " (layer " + std::to_string(first % LAYERS - 1) + ")"; }
    return name;
}

// After the update and the step's loss: every rank has the same loss and norm, so every rank
// takes the same branch (the search for the tensor is collective). scaled_overflow: the loss
// scaler skipped the step for its overflowing gradients (llmc/train/loss_scale.h), which is no failure.
static inline void guard_step_end(Guard* g, int step, float loss, float norm, int scaled_overflow) {
    guard_mark(g, 2LL * step + 2);
    const TrainArgs* a = g->args;
    if (step + 1 == a->steps || step + 1 == a->exit_after) { guard_stop(g); }   // the run's end is not watched
    if ((isfinite(loss) && isfinite(norm)) || scaled_overflow) { return; }
    std::string first = guard_first_nonfinite(g->plan);
    const char* where = first.empty() ? "none (every gradient is finite)" : first.c_str();
    if (strcmp(a->on_nan, "skip") == 0) {
        if (!isfinite(norm)) {   // gpt2_update / dp_update_owned did no AdamW (GPT2.skip_nonfinite)
            printf("step %d: loss %f, gradient norm %f: update skipped (--on-nan skip); first non-finite gradient: %s\n", step + 1,
                   loss, norm, where);
        } else {                 // only the loss: the gradients were finite and the update ran
            printf("step %d: loss %f with a finite gradient norm %f: the update ran (--on-nan skip skips non-finite gradients)\n",
                   step + 1, loss, norm);
        }
        return;
    }
    die("step %d: loss %f, gradient norm %f: training diverged; first non-finite gradient: %s (try a lower --lr, or --on-nan skip)",
        step + 1, loss, norm, where);
}
