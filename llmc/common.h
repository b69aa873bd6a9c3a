// Small helpers shared by every file: fatal errors, checked file I/O, timing.
// Every error in this project ends in die(): one line naming the problem, then a
// non-zero exit (on every rank, once MPI arrives: see llmc/comm/).
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <math.h>
#include <time.h>
#include <string>

// Print "error: <message>" and exit(1). The one way this project reports a fatal error.
__attribute__((format(printf, 1, 2), noreturn))
static inline void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static inline FILE* fopen_or_die(const char* path, const char* mode) {
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
// interrupted save never leaves a partial file that looks finished.
static inline FILE* fopen_tmp_for_write(const char* path, std::string* tmp_path) {
    *tmp_path = std::string(path) + ".tmp";
    return fopen_or_die(tmp_path->c_str(), "wb");
}

static inline void fclose_and_rename(FILE* f, const std::string& tmp_path, const char* path) {
    if (fflush(f) != 0 || ferror(f)) { die("writing '%s' failed", tmp_path.c_str()); }
    fclose(f);
    if (rename(tmp_path.c_str(), path) != 0) {
        die("cannot rename '%s' to '%s': %s", tmp_path.c_str(), path, strerror(errno));
    }
}

static inline double wall_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
