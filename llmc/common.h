// Small helpers shared by every file: fatal errors, checked file I/O, timing.
// Every error in this project ends in die(): one line naming the problem (and, in a run of
// several ranks, the rank that found it), then a non-zero exit; mpirun then ends the other
// ranks. die() also removes the temporary files this process was writing, so a run that fails
// leaves no half-written "<path>.tmp" behind (doc/errors.md lists the messages).
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <math.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>
#include <sys/stat.h>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

// ---- which rank is speaking: "error: [rank 3] ..." once a run has several ranks (-1: one process)
static inline int* die_rank_slot() { static int rank = -1; return &rank; }
// plan_init sets it as soon as MPI knows the ranks
static inline void die_set_rank(int rank, int world_size) { *die_rank_slot() = world_size > 1 ? rank : -1; }
// before MPI starts (the trainer's flags are checked first), the launcher's environment says it:
// Open MPI's mpirun, or MPICH's / Slurm's PMI
static inline void die_set_rank_from_launcher() {
    const char* names[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}};
    for (auto& n : names) {
        const char *rank = getenv(n[0]), *size = getenv(n[1]);
        if (rank && size) { die_set_rank(atoi(rank), atoi(size)); return; }
    }
}

// ---- temporary files being written ("<path>.tmp", see fopen_tmp_for_write): die() removes them
// (and a state directory's lock, and the directory when this run made it and it is still empty)
struct TmpFileList {
    std::mutex mu;
    std::vector<std::string> paths;
};
static inline TmpFileList* tmp_file_list() {
    static TmpFileList* list = new TmpFileList;   // never destroyed: die() may run during exit
    return list;
}
static inline void tmp_file_add(const std::string& path) {
    TmpFileList* l = tmp_file_list();
    std::lock_guard<std::mutex> lock(l->mu);
    l->paths.push_back(path);
}
static inline void tmp_file_forget(const std::string& path) {
    TmpFileList* l = tmp_file_list();
    std::lock_guard<std::mutex> lock(l->mu);
    for (size_t i = 0; i < l->paths.size(); i++) {
        if (l->paths[i] == path) { l->paths.erase(l->paths.begin() + (long)i); return; }
    }
}
static inline void tmp_file_remove_all() {
    TmpFileList* l = tmp_file_list();
    std::lock_guard<std::mutex> lock(l->mu);
    for (size_t i = l->paths.size(); i-- > 0;) {   // newest first: a lock, then the directory made for it
        if (unlink(l->paths[i].c_str()) != 0) { rmdir(l->paths[i].c_str()); }
    }
    l->paths.clear();
}
// A signal that ends the process (mpirun's SIGTERM to the other ranks when one fails, a closed
// stdout pipe, Ctrl-C; llmc/train/guard.h installs it): the temporary files go too, then the signal
// does what it would have done. (No lock in a signal handler: the list is only read, and unlink
// is safe there.)
static inline void tmp_file_signal_handler(int sig) {
    std::vector<std::string>& paths = tmp_file_list()->paths;
    for (size_t i = paths.size(); i-- > 0;) {
        if (unlink(paths[i].c_str()) != 0) { rmdir(paths[i].c_str()); }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

// Remove the temporary files, print "error: <message>" (one whole line whatever the message
// quotes, written with one write(2) so that ranks dying at once, or mpirun --tag-output, never cut it into pieces) and
// exit(1). The one way this project reports a fatal error.
// ---- checking without dying: the planner (llmc/planner/search.h) asks every check of the
// trainer whether a mesh it has never run would pass. Inside die_trap_run, die() throws the
// message instead of ending the process, and the planner prints it as the candidate's reason.
struct DieTrapped { std::string message; };
static inline int* die_trap_slot() { static thread_local int trap = 0; return &trap; }
template <typename F> static inline std::string die_trap_run(F f) {   // "" when f passed every check
    int* trap = die_trap_slot();
    int before = *trap;
    *trap = 1;
    std::string why;
    try { f(); } catch (const DieTrapped& e) { why = e.message; }
    *trap = before;
    return why;
}

// A message may quote a file's contents (a name read from a file, a value from a manifest): its
// control characters are written as escapes (\n, \r, \t, \xHH), so that no content can split an
// error over several lines or move the terminal's cursor.
static inline std::string escape_controls(const char* s) {
    std::string out;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != 0x7f) { out += (char)c; continue; }
        char esc[8];
        snprintf(esc, sizeof(esc), "\\x%02x", c);
        out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : esc;
    }
    return out;
}

__attribute__((noreturn))
static inline void die_message(const char* raw) {
    std::string escaped = escape_controls(raw);
    const char* message = escaped.c_str();
    if (*die_trap_slot()) { throw DieTrapped{message}; }
    static std::atomic<int> dying{0};
    static thread_local int in_die = 0;
    if (in_die) { _exit(1); }   // die() again while exiting (an exit handler): just go
    in_die = 1;
    if (dying.exchange(1)) {    // another thread of this process is reporting: it ends the process
        for (;;) { pause(); }
    }
    tmp_file_remove_all();   // first: a rank that fails may be ended by mpirun any moment now
    fflush(stdout);
    int rank = *die_rank_slot();
    size_t len = strlen(message);
    if (rank >= 0) {   // the rank comes first: drop an older " [rank N]" at the end of the message
        const char* tail = strrchr(message, '[');
        int r, end = 0;
        if (tail && tail > message && tail[-1] == ' ' && sscanf(tail, "[rank %d]%n", &r, &end) == 1 && tail[end] == 0) {
            len = (size_t)(tail - 1 - message);
        }
    }
    char line[4096];
    int n = rank >= 0 ? snprintf(line, sizeof(line), "error: [rank %d] %.*s\n", rank, (int)len, message)
                      : snprintf(line, sizeof(line), "error: %.*s\n", (int)len, message);
    if (n < 0) { n = 0; }
    if ((size_t)n >= sizeof(line)) { n = (int)sizeof(line) - 1; line[n - 1] = '\n'; }   // cut, still one line
    fflush(stderr);
    for (int done = 0; done < n;) {
        ssize_t w = write(2, line + done, (size_t)(n - done));
        if (w <= 0) { break; }
        done += (int)w;
    }
    exit(1);
}

__attribute__((format(printf, 1, 2), noreturn))
static inline void die(const char* fmt, ...) {
    char message[3072];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    die_message(message);
}

// What a path that exists but is not a regular file is, in words ("" for a regular file).
static inline const char* file_kind_unless_regular(const struct stat* st) {
    if (S_ISREG(st->st_mode)) { return ""; }
    if (S_ISDIR(st->st_mode)) { return "a directory"; }
    if (S_ISFIFO(st->st_mode)) { return "a named pipe"; }
    if (S_ISCHR(st->st_mode)) { return "a character device"; }
    if (S_ISBLK(st->st_mode)) { return "a block device"; }
    if (S_ISSOCK(st->st_mode)) { return "a socket"; }
    return "not a regular file";
}

// Every input is read from a regular file, checked before it is opened: a named pipe would block
// the open until someone writes to it (the run would hang), a device would read forever, a
// directory reads nothing. A path that does not exist is left to fopen's own message.
static inline void check_regular_file_or_die(const char* path) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        die("'%s' is %s, expected a file", path, file_kind_unless_regular(&st));
    }
}

static inline FILE* fopen_or_die(const char* path, const char* mode) {
    if (mode[0] == 'r') { check_regular_file_or_die(path); }
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        die("cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
    }
    return f;
}

// Read exactly n items or die naming the file: a short read means a truncated file.
static inline void fread_or_die(void* dst, size_t size, size_t n, FILE* f, const char* path) {
    size_t got = fread(dst, size, n, f);
    if (got != n) {
        die("'%s' is truncated: expected %zu more bytes, got %zu", path, size * n, size * got);
    }
}

static inline void fwrite_or_die(const void* src, size_t size, size_t n, FILE* f, const char* path) {
    if (fwrite(src, size, n, f) != n) {
        die("writing '%s' failed: %s", path, strerror(errno));
    }
}

static inline long file_size_or_die(FILE* f, const char* path) {
    long here = ftell(f);
    if (fseek(f, 0, SEEK_END) != 0) { die("cannot seek in '%s'", path); }
    long size = ftell(f);
    fseek(f, here, SEEK_SET);
    return size;
}

// Files are written to "<path>.tmp" and renamed over <path> only once complete, so an
// interrupted save never leaves a partial file that looks finished. The temporary file is on
// the process's list until the rename: a die() before it (a failed write, a diverged run)
// removes it, and a failed rename too.
static inline FILE* fopen_tmp_for_write(const char* path, std::string* tmp_path) {
    *tmp_path = std::string(path) + ".tmp";
    FILE* f = fopen_or_die(tmp_path->c_str(), "wb");
    tmp_file_add(*tmp_path);
    return f;
}

static inline void fclose_and_rename(FILE* f, const std::string& tmp_path, const char* path) {
    int failed = fflush(f) != 0 || ferror(f), err = errno;
    if (fclose(f) != 0 && !failed) { failed = 1; err = errno; }
    if (failed) { die("writing '%s' failed: %s", tmp_path.c_str(), strerror(err)); }   // (a full disk: EFBIG, ENOSPC)
    if (rename(tmp_path.c_str(), path) != 0) {
        die("cannot rename '%s' to '%s': %s", tmp_path.c_str(), path, strerror(errno));   // die removes the .tmp
    }
    tmp_file_forget(tmp_path);
}

static inline double wall_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// A whole number in [0, INT_MAX] at the start of s, in decimal digits only: *out, and *end after
// it. Returns 0 when there is none or it does not fit an int: "4294967297" is too large, never 1.
static inline int parse_count(const char* s, int* out, const char** end) {
    long long v = 0;
    const char* p = s;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > 2147483647LL) { return 0; }
        p++;
    }
    if (p == s) { return 0; }
    *out = (int)v;
    if (end) { *end = p; }
    return 1;
}
