// Every path a program takes on its command line, with its role, and the checks that follow from
// the roles, run before any work. The trainer declares each path flag's role in its flag table
// (llmc/plan/train_args.h: ARG_IN_FILE, ...), collbench in its own (dev/collbench/collbench.cu, COLLBENCH_PATHS);
// test/test_flag_roles.sh fails on a flag that names a path without a role. The roles:
//   PATH_IN_FILE    a file read                    (--load, --tokenizer, --links, --comm-tuning)
//   PATH_IN_GLOB    files a pattern matches, each  (--train-data, ...; an SFT shard's .mask beside it)
//   PATH_IN_DIR     a directory read               (--resume: a training state)
//   PATH_OUT_FILE   a file written, by rank 0      (--save, --log, --trace, ...: "<path>.tmp", renamed)
//   PATH_STATE_DIR  a directory the job rewrites   (--save-state: every rank writes its files there)
//   PATH_UPDATE_FILE  read, then rewritten         (collbench --autotune -T: its other rows kept)
// The checks (paths_check), on every rank, each rank checking the outputs it writes:
//   inputs    that exist are regular files (a named pipe would block the open, a device read
//             forever), or directories where declared
//   outputs   can be created where they are named: the directory exists and is writable, the
//             name is no directory and no device, it and its ".tmp" are within the file system's
//             limit on a name and on a path, and it is not in /proc or /sys
//   distinct  no output is an input (the same file: device and inode, or the same resolved path
//             when it does not exist yet), another output, or inside a state directory (read or
//             written); no input lies inside the state directory the job writes
#pragma once

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <string>
#include <vector>
#include "common.h"

typedef enum { PATH_NONE, PATH_IN_FILE, PATH_IN_GLOB, PATH_IN_DIR, PATH_OUT_FILE, PATH_STATE_DIR, PATH_UPDATE_FILE } PathRole;
// what --help prints after each path flag: its role
static inline const char* path_role_word(PathRole r) {
    static const char* words[] = {"S", "FILE", "GLOB", "DIR", "OUT", "STATE_DIR", "FILE_RW"};
    return words[r];
}

typedef struct {
    const char* flag;   // as the user types it: "--log", "-T"
    PathRole role;
    const char* path;   // NULL: not given (and no default)
} PathFlag;

// ---- one path's own checks

static inline std::string path_dir_of(std::string p) {
    while (p.size() > 1 && p.back() == '/') { p.pop_back(); }
    size_t slash = p.rfind('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
}

// /proc and /sys hold the kernel's files: a result written there is lost or changes the kernel
static inline void path_check_filesystem(const char* flag, const char* path, const std::string& dir) {
    struct statfs fs;
    if (statfs(dir.c_str(), &fs) == 0 && (fs.f_type == 0x9fa0 || fs.f_type == 0x62656572)) {
        die("%s '%s': '%s' is the kernel's %s file system, not a place for results", flag, path, dir.c_str(),
            fs.f_type == 0x9fa0 ? "proc" : "sys");
    }
}

// The name (the last component, with `suffix` added: ".tmp") and the whole path within the limits
// of the file system it goes to: a 300-byte name would pass every other check and fail at the write
static inline void path_check_length(const char* flag, const char* path, const std::string& dir, size_t suffix) {
    std::string p(path);
    while (p.size() > 1 && p.back() == '/') { p.pop_back(); }
    size_t slash = p.rfind('/');
    size_t name = p.size() - (slash == std::string::npos ? 0 : slash + 1);
    long most = pathconf(dir.c_str(), _PC_NAME_MAX);
    if (most <= 0) { most = NAME_MAX; }
    if ((long)(name + suffix) > most) {
        die("%s: the name '%.40s...' is %zu bytes (%zu with what a save adds), longer than the %ld its file system allows", flag,
            p.c_str() + (slash == std::string::npos ? 0 : slash + 1), name, name + suffix, most);
    }
    if (p.size() + suffix >= PATH_MAX) { die("%s: the path is %zu bytes, at least PATH_MAX %d", flag, p.size() + suffix, PATH_MAX); }
}

// An output: a file (written as "<path>.tmp", then renamed), or a directory (a state directory).
static inline void path_check_output(const char* flag, const char* path, int is_dir) {
    struct stat st;
    std::string p(path);
    if (p.empty()) { die("%s: the path is empty", flag); }
    if (!is_dir && p.back() == '/') { die("%s '%s' ends in '/': it takes a file name", flag, path); }
    int exists = stat(path, &st) == 0;
    if (exists && is_dir && !S_ISDIR(st.st_mode)) {
        die("%s '%s' exists and is not a directory (the training state is a directory)", flag, path);
    }
    if (exists && !is_dir && S_ISDIR(st.st_mode)) { die("%s '%s' is a directory; it takes a file name", flag, path); }
    if (exists && !is_dir && !S_ISREG(st.st_mode)) {
        die("%s '%s' is not a regular file (the write ends by renaming '%s.tmp' over it)", flag, path, path);
    }
    if (!is_dir) {
        std::string tmp = p + ".tmp";
        if (stat(tmp.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
            die("%s '%s': its temporary file '%s' is a directory", flag, path, tmp.c_str());
        }
    }
    std::string dir = is_dir && exists ? p : path_dir_of(p);   // where the file (or the state directory) goes
    if (stat(dir.c_str(), &st) != 0) { die("%s '%s': the directory '%s' does not exist", flag, path, dir.c_str()); }
    if (!S_ISDIR(st.st_mode)) { die("%s '%s': '%s' is not a directory", flag, path, dir.c_str()); }
    path_check_filesystem(flag, path, dir);
    if (access(dir.c_str(), W_OK | X_OK) != 0) { die("%s '%s': cannot write into '%s': %s", flag, path, dir.c_str(), strerror(errno)); }
    // a file: "<name>.tmp"; a state directory: its own name, then "step-NNNNNNNN.tmp/rank-NNNNN.bin" inside it
    path_check_length(flag, path, path_dir_of(p), is_dir ? 0 : 4);
    if (is_dir && p.size() + 34 >= PATH_MAX) { die("%s: the path is %zu bytes: its files' paths would pass PATH_MAX %d", flag, p.size(), PATH_MAX); }
}

// A state directory that exists: what a save writes or removes there must be of the kind it
// expects, or the save would fail only after the steps before it ran. step-K and step-K.tmp are
// directories, latest and lock regular files, latest.tmp no directory. (lstat: a symbolic link is
// none of these, and a save never follows one out of the directory.)
static inline void path_check_state_dir(const char* flag, const char* path) {
    DIR* d = opendir(path);
    if (!d) { return; }
    std::string bad, want;
    while (struct dirent* e = readdir(d)) {
        std::string n = e->d_name, full = std::string(path) + "/" + n;
        struct stat st;
        if (lstat(full.c_str(), &st) != 0) { continue; }
        if (n.compare(0, 5, "step-") == 0 && !S_ISDIR(st.st_mode)) { want = "a directory (a save writes step-K and step-K.tmp directories)"; }
        else if (n == "latest" && !S_ISREG(st.st_mode)) { want = "a regular file (the name of the newest state)"; }
        else if (n == "lock" && !S_ISREG(st.st_mode)) { want = "a regular file (the job holding the directory)"; }
        else if (n == "latest.tmp" && S_ISDIR(st.st_mode)) { want = "a regular file (latest is written there first)"; }
        else { continue; }
        bad = full;
        break;
    }
    closedir(d);
    if (!bad.empty()) { die("%s '%s': '%s' is not %s", flag, path, bad.c_str(), want.c_str()); }
}

// ---- the paths compared with each other

typedef struct {
    std::string flag, given;   // the flag and the path (or pattern) as given
    std::string path;          // this file's path (a pattern's match)
    std::string resolved;      // the absolute path, its directory resolved through symlinks
    int exists;
    dev_t dev;
    ino_t ino;
} NamedFile;

static inline NamedFile named_file(const char* flag, const std::string& given, const std::string& path) {
    NamedFile f{flag, given, path, "", 0, 0, 0};
    struct stat st;
    if (stat(path.c_str(), &st) == 0) { f.exists = 1; f.dev = st.st_dev; f.ino = st.st_ino; }
    char buf[PATH_MAX];
    if (realpath(path.c_str(), buf)) {
        f.resolved = buf;
    } else {   // not there yet: its directory resolved, then its name
        size_t slash = path.rfind('/');
        std::string dir = path_dir_of(path);
        std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
        f.resolved = (realpath(dir.c_str(), buf) ? std::string(buf) : dir) + "/" + name;
    }
    return f;
}

static inline int same_file(const NamedFile& a, const NamedFile& b) {
    if (a.exists && b.exists) { return a.dev == b.dev && a.ino == b.ino; }
    return a.resolved == b.resolved;
}

// An input that exists must be a regular file (the reader's own message names one that does not exist)
static inline void path_check_input_file(const char* flag, const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        die("%s: '%s' is %s, expected a file", flag, path.c_str(), file_kind_unless_regular(&st));
    }
}

// Every file a pattern matches (and an SFT shard's mask beside it), each checked to be a regular
// file; the pattern itself when nothing matches (an output named exactly like it is still refused).
static inline void add_input_files(std::vector<NamedFile>* in, const char* flag, const char* pattern) {
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            std::string p = g.gl_pathv[i];
            path_check_input_file(flag, p);
            in->push_back(named_file(flag, pattern, p));
            if (p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0) {
                std::string mask = p.substr(0, p.size() - 4) + ".mask";
                struct stat st;
                if (lstat(mask.c_str(), &st) == 0) {
                    path_check_input_file(flag, mask);
                    in->push_back(named_file(flag, pattern, mask));
                }
            }
        }
    } else {
        in->push_back(named_file(flag, pattern, pattern));
    }
    globfree(&g);
}

// The directory itself, or a path inside it (a state directory not made yet: the path it will have)
static inline int path_inside(const std::string& resolved, const char* dir) {
    std::string d = named_file("", dir, dir).resolved;
    while (d.size() > 1 && d.back() == '/') { d.pop_back(); }
    return resolved == d || resolved.compare(0, d.size() + 1, d == "/" ? d : d + "/") == 0;
}

// ---- every declared path, by its role. writer: this rank writes the output files (rank 0);
// every rank writes its files into a state directory.
static inline void paths_check(const std::vector<PathFlag>& flags, int writer) {
    std::vector<NamedFile> in, out;
    std::vector<const PathFlag*> states;   // read or written
    for (const PathFlag& f : flags) {
        if (!f.path) { continue; }
        switch (f.role) {
            case PATH_IN_FILE: path_check_input_file(f.flag, f.path); in.push_back(named_file(f.flag, f.path, f.path)); break;
            case PATH_IN_GLOB: add_input_files(&in, f.flag, f.path); break;
            case PATH_IN_DIR: {
                struct stat st;
                if (stat(f.path, &st) == 0 && !S_ISDIR(st.st_mode)) {
                    die("%s '%s' is %s, expected a directory", f.flag, f.path, file_kind_unless_regular(&st)[0] ? file_kind_unless_regular(&st) : "a file");
                }
                states.push_back(&f);
                break;
            }
            case PATH_UPDATE_FILE:   // read, then written: an input's check and an output's
            case PATH_OUT_FILE:
                if (f.role == PATH_UPDATE_FILE) { path_check_input_file(f.flag, f.path); }
                if (writer) { path_check_output(f.flag, f.path, 0); }
                out.push_back(named_file(f.flag, f.path, f.path));
                break;
            case PATH_STATE_DIR:
                path_check_output(f.flag, f.path, 1);
                path_check_state_dir(f.flag, f.path);
                states.push_back(&f);
                break;
            case PATH_NONE: break;
        }
    }
    for (const NamedFile& x : in) {
        for (const PathFlag* s : states) {
            if (s->role == PATH_STATE_DIR && path_inside(x.resolved, s->path)) {
                die("%s: the input '%s' lies inside the training-state directory %s '%s', which this job rewrites",
                    x.flag.c_str(), x.path.c_str(), s->flag, s->path);
            }
        }
    }
    for (size_t i = 0; i < out.size(); i++) {
        const NamedFile& o = out[i];
        for (const NamedFile& x : in) {
            if (same_file(o, x)) {
                die("%s '%s' is the same file as the input '%s' (%s '%s'): writing it would overwrite that input",
                    o.flag.c_str(), o.given.c_str(), x.path.c_str(), x.flag.c_str(), x.given.c_str());
            }
        }
        for (size_t j = 0; j < i; j++) {
            if (same_file(o, out[j])) {
                die("%s '%s' and %s '%s' are the same file: each output needs a path of its own", out[j].flag.c_str(),
                    out[j].given.c_str(), o.flag.c_str(), o.given.c_str());
            }
        }
        for (const PathFlag* s : states) {
            if (path_inside(o.resolved, s->path)) {
                die("%s '%s' is, or is inside, the training-state directory %s '%s', whose files the state writes and removes",
                    o.flag.c_str(), o.given.c_str(), s->flag, s->path);
            }
        }
    }
}
