// Output paths, checked before step 1, so that a run that could not write its results, or would
// overwrite its inputs, fails before any work instead of after the last step:
//   outputs_check_writable   each output a path the run can write: its directory exists and is
//                            writable, it is no directory and no device, its .tmp no directory;
//                            --save-state's directory holds nothing a save could not replace
//   outputs_check_distinct   no output the same file as an input or another output
//
// `--log data/arithmetic/val_000000.bin` would replace a validation shard with a log, and
// `--save run.bin --log run.bin` would leave whichever file is written last. So before any work
// (after outputs_check_writable has found every output path writable) every output file is compared
// with every input file the flags name and with every other output:
//   the same file     when both exist: the same device and inode (a hard link, a symlink, "./x"
//                     and "x" all count); when the output does not exist yet: the same resolved
//                     path (its directory through realpath, then its name)
//   inside a state    an output file that is --save-state's or --resume's directory or lies
//                     inside it, whose files the training state writes and removes itself
// Inputs: --train-data, --val-data, --sft-train, --sft-val, --prompts (globs, each shard's
// ".mask" beside it), --tokenizer, --load, --links, given or default, whether or not this run's
// task reads them: a path named as an input is never written.
#pragma once

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string>
#include <vector>
#include "../common.h"
#include "train_args.h"

// ---------------------------------------------------------------------------------------
// Every output path writable, checked before any work (the trainer calls outputs_check_writable,
// then outputs_check_distinct below)

// One output: a file (written as "<path>.tmp", then renamed), or a directory (--save-state).
static inline void outputs_check_one(const char* flag, const char* path, int is_dir) {
    struct stat st;
    std::string p(path);
    if (p.empty()) { die("--%s: the path is empty", flag); }
    if (!is_dir && p.back() == '/') { die("--%s '%s' ends in '/': it takes a file name", flag, path); }
    int exists = stat(path, &st) == 0;
    if (exists && is_dir && !S_ISDIR(st.st_mode)) {
        die("--%s '%s' exists and is not a directory (the training state is a directory)", flag, path);
    }
    if (exists && !is_dir && S_ISDIR(st.st_mode)) { die("--%s '%s' is a directory; it takes a file name", flag, path); }
    if (exists && !is_dir && !S_ISREG(st.st_mode)) {
        die("--%s '%s' is not a regular file (the write ends by renaming '%s.tmp' over it)", flag, path, path);
    }
    if (!is_dir) {
        std::string tmp = p + ".tmp";
        if (stat(tmp.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
            die("--%s '%s': its temporary file '%s' is a directory", flag, path, tmp.c_str());
        }
    }
    // the directory the file (or the state directory) goes into
    std::string dir;
    if (is_dir && exists) {
        dir = p;
    } else {
        while (p.size() > 1 && p.back() == '/') { p.pop_back(); }
        size_t slash = p.rfind('/');
        dir = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
    }
    if (stat(dir.c_str(), &st) != 0) { die("--%s '%s': the directory '%s' does not exist", flag, path, dir.c_str()); }
    if (!S_ISDIR(st.st_mode)) { die("--%s '%s': '%s' is not a directory", flag, path, dir.c_str()); }
    if (access(dir.c_str(), W_OK | X_OK) != 0) {
        die("--%s '%s': cannot write into '%s': %s", flag, path, dir.c_str(), strerror(errno));
    }
}

// --save-state DIR that exists: what a save writes or removes there must be of the kind it expects,
// or the save would fail only after the steps before it ran. step-K and step-K.tmp are directories
// (a save removes a stale step-K.tmp directory, never a file of that name: refusing one here is
// clearer than deleting what someone put there), latest is a regular file, latest.tmp no directory.
// (lstat: a symbolic link is none of these, and a save never follows one out of DIR.)
static inline void outputs_check_state_dir(const char* path) {
    DIR* d = opendir(path);
    if (!d) { return; }
    std::string bad, want;
    while (struct dirent* e = readdir(d)) {
        std::string n = e->d_name, full = std::string(path) + "/" + n;
        struct stat st;
        if (lstat(full.c_str(), &st) != 0) { continue; }
        if (n.compare(0, 5, "step-") == 0 && !S_ISDIR(st.st_mode)) { want = "a directory (a save writes step-K and step-K.tmp directories)"; }
        else if (n == "latest" && !S_ISREG(st.st_mode)) { want = "a regular file (the name of the newest state)"; }
        else if (n == "latest.tmp" && S_ISDIR(st.st_mode)) { want = "a regular file (latest is written there first)"; }
        else { continue; }
        bad = full;
        break;
    }
    closedir(d);
    if (!bad.empty()) { die("--save-state '%s': '%s' is not %s", path, bad.c_str(), want.c_str()); }
}

// Rank 0 writes the files (--save, --log, --trace, --metrics, --ps-log, --plan-check) and checks them; every rank writes
// its shard of the training state and checks --save-state. An error on one rank makes mpirun end
// the others.
static inline void outputs_check_writable(const TrainArgs* a, int rank) {
    if (rank == 0) {
        struct { const char* flag; const char* path; } files[] = {
            {"save", a->save}, {"log", a->log}, {"trace", a->trace}, {"metrics", a->metrics}, {"ps-log", a->ps_log},
            {"plan-check", a->plan_check}};
        for (auto& f : files) {
            if (f.path) { outputs_check_one(f.flag, f.path, 0); }
        }
    }
    if (a->save_state) {
        outputs_check_one("save-state", a->save_state, 1);
        outputs_check_state_dir(a->save_state);
    }
}

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
        std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
        std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
        f.resolved = (realpath(dir.c_str(), buf) ? std::string(buf) : dir) + "/" + name;
    }
    return f;
}

static inline int same_file(const NamedFile& a, const NamedFile& b) {
    if (a.exists && b.exists) { return a.dev == b.dev && a.ino == b.ino; }
    return a.resolved == b.resolved;
}

// Every file a pattern matches (and an SFT shard's mask beside it); the pattern itself when
// nothing matches (an output named exactly like it is still refused).
static inline void add_input_files(std::vector<NamedFile>* in, const char* flag, const char* pattern) {
    if (!pattern) { return; }
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            std::string p = g.gl_pathv[i];
            in->push_back(named_file(flag, pattern, p));
            if (p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0) {
                std::string mask = p.substr(0, p.size() - 4) + ".mask";
                struct stat st;
                if (stat(mask.c_str(), &st) == 0) { in->push_back(named_file(flag, pattern, mask)); }
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

// ---------------------------------------------------------------------------------------
// Outputs that would overwrite an input or each other

// Every rank checks (rank 0 writes the files, but every rank reads the inputs: each must stop
// before it reads one that is about to be overwritten, with the same message).
static inline void outputs_check_distinct(const TrainArgs* a) {
    std::vector<NamedFile> in, out;
    add_input_files(&in, "train-data", a->train_data);
    add_input_files(&in, "val-data", a->val_data);
    add_input_files(&in, "sft-train", a->sft_train);
    add_input_files(&in, "sft-val", a->sft_val);
    add_input_files(&in, "prompts", a->prompts);
    add_input_files(&in, "tokenizer", a->tokenizer);
    add_input_files(&in, "load", a->load);
    add_input_files(&in, "links", a->links);
    struct { const char* flag; const char* path; } outputs[] = {
        {"save", a->save}, {"log", a->log}, {"trace", a->trace}, {"metrics", a->metrics}, {"ps-log", a->ps_log},
        {"plan-check", a->plan_check}};
    for (auto& o : outputs) {
        if (o.path) { out.push_back(named_file(o.flag, o.path, o.path)); }
    }
    for (size_t i = 0; i < out.size(); i++) {
        const NamedFile& o = out[i];
        for (const NamedFile& x : in) {
            if (same_file(o, x)) {
                die("--%s '%s' is the same file as the input '%s' (--%s '%s'): writing it would overwrite that input",
                    o.flag.c_str(), o.given.c_str(), x.path.c_str(), x.flag.c_str(), x.given.c_str());
            }
        }
        for (size_t j = 0; j < i; j++) {
            if (same_file(o, out[j])) {
                die("--%s '%s' and --%s '%s' are the same file: each output needs a path of its own", out[j].flag.c_str(),
                    out[j].given.c_str(), o.flag.c_str(), o.given.c_str());
            }
        }
        struct { const char* flag; const char* dir; } states[] = {{"save-state", a->save_state}, {"resume", a->resume}};
        for (auto& s : states) {
            if (s.dir && path_inside(o.resolved, s.dir)) {
                die("--%s '%s' is, or is inside, the training-state directory --%s '%s', whose files the state writes and removes",
                    o.flag.c_str(), o.given.c_str(), s.flag, s.dir);
            }
        }
    }
}
