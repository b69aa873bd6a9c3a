// The files of a training state (llmc/train/train_state.h), written so that a failure is
// reported instead of dying halfway (a failed save must clean up on every rank first), each
// with a checksum, in flat directories removed whole; and the text files read back.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include <vector>
#include "../common.h"
#include "../tasks/task.h"

// A file being written: its running CRC-32 and size, and the first error (then nothing more is written)
typedef struct {
    FILE* f;
    std::string path, err;
    uint64_t hash, bytes;
} StateWriter;

// CRC-32 (IEEE 802.3, as zlib's crc32 and Python's zlib.crc32 compute it): a corrupt rank file
// is caught before its numbers are used
static inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    static uint32_t table[256];
    static int ready = 0;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) { c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1; }
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char* p = (const unsigned char*)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) { crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8); }
    return ~crc;
}

static inline void sw_open(StateWriter* w, const std::string& path) {
    w->path = path;
    w->err.clear();
    w->hash = 0;
    w->bytes = 0;
    w->f = fopen(path.c_str(), "wb");
    if (!w->f) { w->err = "cannot create '" + path + "': " + strerror(errno); }
}
static inline void sw_write(StateWriter* w, const void* data, size_t bytes) {
    if (!w->err.empty()) { return; }
    if (fwrite(data, 1, bytes, w->f) != bytes) { w->err = "writing '" + w->path + "' failed: " + strerror(errno); return; }
    w->hash = crc32_update((uint32_t)w->hash, data, bytes);
    w->bytes += bytes;
}
// closes; on any error removes the file. Returns 1 when the file is complete.
static inline int sw_close(StateWriter* w) {
    if (w->f) {
        if (w->err.empty() && (fflush(w->f) != 0 || ferror(w->f))) { w->err = "writing '" + w->path + "' failed: " + strerror(errno); }
        if (fclose(w->f) != 0 && w->err.empty()) { w->err = "closing '" + w->path + "' failed: " + strerror(errno); }
        w->f = NULL;
    }
    if (!w->err.empty()) { unlink(w->path.c_str()); }
    return w->err.empty();
}

static inline void remove_flat_dir(const std::string& dir) {
    DIR* d = opendir(dir.c_str());
    if (!d) { return; }
    while (struct dirent* e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) { unlink((dir + "/" + e->d_name).c_str()); }
    }
    closedir(d);
    rmdir(dir.c_str());
}

static inline int is_dir(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

static inline std::string read_text_or_die(const std::string& path) {
    FILE* f = fopen_or_die(path.c_str(), "rb");   // (a directory: named as one)
    std::string s;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) { s.append(buf, got); }
    fclose(f);
    return s;
}

// "key value..." lines -> key -> rest of the line (repeated keys: the "file" lines, kept in order)
static inline Position parse_lines(const std::string& text, std::vector<std::string>* files) {
    Position kv;
    size_t at = 0;
    while (at < text.size()) {
        size_t nl = text.find('\n', at);
        std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
        at = nl == std::string::npos ? text.size() : nl + 1;
        size_t sp = line.find(' ');
        if (line.empty() || sp == std::string::npos) { continue; }
        std::string key = line.substr(0, sp), value = line.substr(sp + 1);
        if (key == "file" && files) { files->push_back(value); } else { kv[key] = value; }
    }
    return kv;
}
