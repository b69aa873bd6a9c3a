// Command-line flags of the trainer: a table of (name, type, destination, help), parsed
// strictly: an unknown flag, a missing value or a value that is not a number stops the
// program with a one-line error naming the flag.
#pragma once

#include <errno.h>
#include <limits.h>
#include <string>
#include <vector>
#include "../common.h"
#include "../paths.h"

// ARG_STRING: a word (a name, a mode, a list); a flag that names a path takes one of the path
// types instead, its role (llmc/paths.h): the checks of every path follow from it (paths_check)
typedef enum { ARG_INT, ARG_FLOAT, ARG_STRING, ARG_SWITCH, ARG_IN_FILE, ARG_IN_GLOB, ARG_IN_DIR, ARG_OUT_FILE, ARG_STATE_DIR } ArgType;
static inline PathRole arg_path_role(ArgType t) {
    switch (t) {
        case ARG_IN_FILE: return PATH_IN_FILE;
        case ARG_IN_GLOB: return PATH_IN_GLOB;
        case ARG_IN_DIR: return PATH_IN_DIR;
        case ARG_OUT_FILE: return PATH_OUT_FILE;
        case ARG_STATE_DIR: return PATH_STATE_DIR;
        default: return PATH_NONE;
    }
}

typedef struct {
    const char* name;    // without the leading "--"
    ArgType type;
    void* dest;          // int*, float*, const char** or int* (switch: set to 1)
    const char* help;
} ArgSpec;

static inline void args_usage(const char* prog, const ArgSpec* specs, int n, const char* intro) {
    printf("usage: %s [flags]\n%s\n\nflags (defaults in brackets):\n", prog, intro);
    for (int i = 0; i < n; i++) {
        char def[64] = "";
        switch (specs[i].type) {
            case ARG_INT: snprintf(def, sizeof(def), "%d", *(int*)specs[i].dest); break;
            case ARG_FLOAT: snprintf(def, sizeof(def), "%g", *(float*)specs[i].dest); break;
            default: {   // a word or a path
                const char* s = *(const char**)specs[i].dest;
                snprintf(def, sizeof(def), "%s", s ? s : "none");
                break;
            }
            case ARG_SWITCH: snprintf(def, sizeof(def), "off"); break;
        }
        std::string kind = specs[i].type == ARG_INT ? " N" : specs[i].type == ARG_FLOAT ? " X" : specs[i].type == ARG_SWITCH ? "" :
                           std::string(" ") + path_role_word(arg_path_role(specs[i].type));
        char flag[48];
        snprintf(flag, sizeof(flag), "--%s%s", specs[i].name, kind.c_str());
        printf("  %-22s %s [%s]\n", flag, specs[i].help, def);
    }
}

// The flags the command line gave (by name, without "--"): a flag that only means something beside
// another is refused when that other is missing (llmc/train/train_args_check.h, train_args_check_unused).
static inline std::vector<std::string>* args_given_list() { static std::vector<std::string> given; return &given; }
static inline int args_given(const char* name) {
    for (const std::string& g : *args_given_list()) { if (g == name) { return 1; } }
    return 0;
}

// The path flags of the table args_parse read last, each with its role and where its value is
// (the trainer's paths_check walks them: llmc/train/outputs.h)
typedef struct { std::string flag; PathRole role; const char** dest; } ArgPath;
static inline std::vector<ArgPath>* args_paths() { static std::vector<ArgPath> paths; return &paths; }

static inline void args_parse(int argc, char** argv, const ArgSpec* specs, int n, const char* intro) {
    args_paths()->clear();
    for (int k = 0; k < n; k++) {
        if (arg_path_role(specs[k].type) != PATH_NONE) {
            args_paths()->push_back({std::string("--") + specs[k].name, arg_path_role(specs[k].type), (const char**)specs[k].dest});
        }
    }
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            args_usage(argv[0], specs, n, intro);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) { die("unexpected argument '%s': flags start with -- (see --help)", arg); }
        // accept both "--name value" and "--name=value"
        std::string name = arg + 2, value;
        int has_inline_value = 0;
        size_t eq = name.find('=');
        if (eq != std::string::npos) { value = name.substr(eq + 1); name = name.substr(0, eq); has_inline_value = 1; }
        const ArgSpec* spec = NULL;
        for (int k = 0; k < n; k++) { if (name == specs[k].name) { spec = &specs[k]; } }
        if (spec == NULL) { die("unknown flag '--%s' (see --help)", name.c_str()); }
        args_given_list()->push_back(name);
        if (spec->type == ARG_SWITCH) {
            if (has_inline_value) { die("flag '--%s' takes no value", name.c_str()); }
            *(int*)spec->dest = 1;
            continue;
        }
        if (!has_inline_value) {
            if (i + 1 >= argc) { die("flag '--%s' needs a value", name.c_str()); }
            value = argv[++i];
        }
        const char* v = value.c_str();
        char* end = NULL;
        errno = 0;
        if (spec->type == ARG_INT) {
            long x = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || errno != 0 || x < INT_MIN || x > INT_MAX) {
                die("flag '--%s' expects an integer, got '%s'", name.c_str(), v);
            }
            *(int*)spec->dest = (int)x;
        } else if (spec->type == ARG_FLOAT) {
            float x = strtof(v, &end);
            if (*v == '\0' || *end != '\0' || errno != 0 || !isfinite(x)) {
                die("flag '--%s' expects a number, got '%s'", name.c_str(), v);
            }
            *(float*)spec->dest = x;
        } else {
            *(const char**)spec->dest = strdup(v);
        }
    }
}
