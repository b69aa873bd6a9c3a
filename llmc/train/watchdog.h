// What a rank's --comm-timeout watchdog (llmc/train/guard.h) knows besides the marks: when it last heard
// each other rank, whether this rank was itself stopped, and which rank prints the verdict.
// Three rules make a job end with one verdict, printed once:
//   1. A rank that was not running knows it: it got SIGCONT (which continues a stopped process),
//      or its watchdog, which looks every 0.05 s, finds that far more time went by since its last
//      look (late_after, about as long as the others wait before they call a rank frozen). It heard
//      no one meanwhile, so it forgets what it measured: its own wait and the others' silences
//      start again from now. It accuses no one. (When mpirun ends a job it continues a stopped
//      rank with SIGCONT before its SIGTERM: that rank runs for a moment.)
//   2. A rank whose heartbeats stopped for longer than silent_after at any time during this rank's
//      wait was frozen, even if its heartbeats came back since (that moment of running again), and
//      it keeps the mark it had before. While a rank has missed a few heartbeats (over a second's
//      worth) but has not yet been silent for silent_after, the verdict waits: it is frozen or late;
//      and for a second after such a rank is heard again (stopped briefly, it lets the run go on).
//   3. One rank speaks: the lowest rank the verdict does not name, among those that wait too (a
//      flag in their heartbeats: no progress for half the timeout; a rank that goes on, like the
//      other workers of the asynchronous parameter server, does not speak; with no other rank
//      waiting, a rank speaks for itself). It sets a flag in a
//      last heartbeat to the others, prints the verdict and ends the job; the others say nothing,
//      and mpirun ends them. Only if the job has not ended a grace period after a rank reached its
//      verdict (the timeout plus silent_after: time for the speaker to wait all over again, rule 1)
//      does it print its own; or, if it heard the flag, it ends quietly (exit status 1).
#pragma once

#include <signal.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <vector>

// A heartbeat: {step mark, hook events in the step, last event, flags} (see Guard in llmc/train/guard.h)
typedef std::array<long long, 4> Heartbeat;
// flags: WATCH_SPOKE this rank printed the verdict and is ending the job; WATCH_WAITING its main
// thread made no progress for half the timeout; WATCH_DONE its steps are done, the watchdog stopped
// (its heartbeats stop for that reason, not because it is frozen)
enum { WATCH_SPOKE = 1, WATCH_WAITING = 2, WATCH_DONE = 4 };

typedef struct Watch {
    double silent_after;   // a rank silent this long is frozen (or gone)
    double late_after;     // this watchdog looked this much late: this process was not running
    double grace;          // how long a rank that does not speak waits for the one that does
    double last_look;      // when this watchdog last looked
    int continued;         // the SIGCONTs counted at that look
    double back_at;        // when this rank last came back from being stopped (0: never)
    double decided_at;     // when this rank reached a verdict in the current wait (0: not yet)
    int spoke;             // another rank's heartbeat said it printed the verdict
    std::vector<long long> flags;       // each rank's flags, from its last heartbeat
    std::vector<double> heard;          // when each rank's last heartbeat came
    std::vector<double> gap, gap_end;   // each rank's last silence longer than silent_after, and when it ended
    std::vector<double> back;           // when each rank was last heard again after missing a second of heartbeats
} Watch;

// SIGCONT counted (the watchdog installs the handler: guard_init)
static inline std::atomic<int>* watch_continued() { static std::atomic<int> count{0}; return &count; }
static inline void watch_on_sigcont(int sig) { (void)sig; watch_continued()->fetch_add(1); }

static inline void watch_init(Watch* w, int n, double timeout, double now) {
    w->silent_after = std::max(3.0, timeout / 2);
    w->late_after = w->silent_after - 0.5;
    w->grace = timeout + w->silent_after;   // enough for the speaker to wait a whole timeout again (rule 1)
    w->last_look = now;
    w->continued = watch_continued()->load();
    w->back_at = 0.0;
    w->decided_at = 0.0;
    w->spoke = 0;
    w->flags.assign(n, 0);
    w->heard.assign(n, now);
    w->gap.assign(n, 0.0);
    w->gap_end.assign(n, 0.0);
    w->back.assign(n, -1e9);
}

// Rule 1, at each look: a SIGCONT, or the time since the last look, shows that this process was stopped
static inline void watch_look(Watch* w, double now) {
    int continued = watch_continued()->load();
    if (continued != w->continued || now - w->last_look > w->late_after) {
        w->continued = continued;
        w->back_at = now;
        w->decided_at = 0.0;
        std::fill(w->heard.begin(), w->heard.end(), now);
        std::fill(w->gap.begin(), w->gap.end(), 0.0);
    }
    w->last_look = now;
}

// The start of this rank's wait: its last progress, or its return from being stopped
static inline double watch_since(const Watch* w, double last_progress) { return std::max(last_progress, w->back_at); }

// A heartbeat of rank p arrived, with these flags: a long silence before it is remembered (rule 2).
// Returns 1 when p was frozen during this rank's wait (which began at `since`): its mark is then the one before.
static inline int watch_heard(Watch* w, int p, long long flags, double now, double since) {
    w->flags[p] = flags;
    if (flags & WATCH_SPOKE) { w->spoke = 1; }
    if (now - w->heard[p] > 1.0) { w->back[p] = now; }
    if (now - w->heard[p] > w->silent_after) {
        w->gap[p] = now - w->heard[p];
        w->gap_end[p] = now;
    }
    w->heard[p] = now;
    return w->gap_end[p] > since;
}

// How long rank p has been silent during this rank's wait: its silence now, or a longer one that ended in it
static inline double watch_silence(const Watch* w, int p, double now, double since) {
    if (w->flags[p] & WATCH_DONE) { return 0.0; }   // silent because it finished, not frozen
    double quiet = now - w->heard[p];
    return w->gap_end[p] > since ? std::max(quiet, w->gap[p]) : quiet;
}

// Not sure yet: some rank missed four heartbeats (0.25 s apart) but is not silent_after yet, or
// it came back from such a silence less than a second ago (a short stop: the run may go on now)
static inline int watch_unsure(const Watch* w, int me, double now) {
    for (int p = 0; p < (int)w->heard.size(); p++) {
        double quiet = now - w->heard[p];
        if (p == me || (w->flags[p] & WATCH_DONE)) { continue; }
        if ((quiet > 1.0 && quiet <= w->silent_after) || now - w->back[p] < 1.0) { return 1; }
    }
    return 0;
}

// Rule 3: the rank that prints the verdict, the lowest one it does not name among this rank and
// those waiting too (their flag); this rank when there is none (it names every waiting rank)
static inline int watch_speaker(const Watch* w, const std::vector<int>& named, int me) {
    for (int r = 0; r < (int)w->flags.size(); r++) {
        int waits = r == me || (w->flags[r] & WATCH_WAITING);
        if (waits && std::find(named.begin(), named.end(), r) == named.end()) { return r; }
    }
    return me;
}
