// One job per training-state directory: rank 0 holds DIR/lock, "HOST PID", from before step 1 to
// the end of the run. A second job naming the same --save-state is refused at once, naming the
// holder; without the lock both would write step directories into DIR and one would die steps
// later on the other's files, never told why. A lock whose process is gone (kill -9, a crashed
// node) on this host is stale: taken over, with a line saying so. One on another host cannot be
// judged from here: refused, naming it (remove the file when that job is known to be gone).
// die() and a fatal signal remove the lock (it is on the temporary-file list, llmc/common.h).
#pragma once

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include "../common.h"

static inline std::string state_lock_host() {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    return host;
}

// Takes DIR/lock (making DIR when it is not there yet). Rank 0, before step 1.
static inline void state_lock_take(const char* dir) {
    std::string d = dir, lock = d + "/lock", host = state_lock_host();
    if (mkdir(dir, 0755) == 0) { tmp_file_add(d); }   // made here: removed again if the run fails before it saves
    else if (errno != EEXIST) { die("--save-state '%s': cannot create it: %s", dir, strerror(errno)); }
    std::string mine = host + " " + std::to_string((long)getpid()) + "\n", tmp = lock + "." + std::to_string((long)getpid());
    for (int attempt = 0; attempt < 2; attempt++) {
        FILE* f = fopen(tmp.c_str(), "wb");   // the whole line first, then linked into place: no reader sees half a lock
        if (!f || fputs(mine.c_str(), f) < 0 || fclose(f) != 0) { unlink(tmp.c_str()); die("--save-state '%s': cannot write its lock: %s", dir, strerror(errno)); }
        int taken = link(tmp.c_str(), lock.c_str()) == 0, err = errno;
        unlink(tmp.c_str());
        if (taken) { tmp_file_add(lock); return; }
        if (err != EEXIST) { die("--save-state '%s': cannot take its lock '%s': %s", dir, lock.c_str(), strerror(err)); }
        std::string held;
        if (FILE* h = fopen(lock.c_str(), "rb")) {
            char buf[300];
            size_t n = fread(buf, 1, sizeof(buf) - 1, h);
            fclose(h);
            held.assign(buf, n);
        }
        char holder[256] = "";
        long pid = 0;
        int end = 0;
        if (sscanf(held.c_str(), "%255s %ld%n", holder, &pid, &end) != 2 || pid <= 0 || held.compare(end, std::string::npos, "\n") != 0) {
            die("--save-state '%s': its lock '%s' holds '%.60s', not 'HOST PID': remove it if no job uses '%s'", dir, lock.c_str(),
                held.c_str(), dir);
        }
        if (holder != host || kill((pid_t)pid, 0) == 0 || errno != ESRCH || attempt > 0) {
            die("--save-state '%s' is in use by another job: host %s, process %ld (its lock '%s'; remove that file if the job "
                "is gone)", dir, holder, pid, lock.c_str());
        }
        printf("state lock   '%s' was left by process %ld on this host, which is gone: taken over\n", lock.c_str(), pid);
        unlink(lock.c_str());
    }
}

// The end of a run that succeeded: the lock goes, the directory stays
static inline void state_lock_release(const char* dir) {
    std::string d = dir, lock = d + "/lock";
    unlink(lock.c_str());
    tmp_file_forget(lock);
    tmp_file_forget(d);
}
