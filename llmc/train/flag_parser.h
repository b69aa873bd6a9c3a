// Command-line flags of the trainer: a table of (name, type, destination, help), parsed
// strictly: an unknown flag, a missing value or a value that is not a number stops the
// program with a one-line error naming the flag.
#pragma once

#include <errno.h>
#include <limits.h>
#include <string>
#include <vector>
#include "../common.h"

typedef enum { ARG_INT, ARG_FLOAT, ARG_STRING, ARG_SWITCH } ArgType;

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
            case ARG_STRING: {
                const char* s = *(const char**)specs[i].dest;
                snprintf(def, sizeof(def), "%s", s ? s : "none");
                break;
            }
            case ARG_SWITCH: snprintf(def, sizeof(def), "off"); break;
        }
        const char* kind = specs[i].type == ARG_INT ? " N" : specs[i].type == ARG_FLOAT ? " X" :
                           specs[i].type == ARG_STRING ? " S" : "";
        char flag[48];
        snprintf(flag, sizeof(flag), "--%s%s", specs[i].name, kind);
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

static inline void args_parse(int argc, char** argv, const ArgSpec* specs, int n, const char* intro) {
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
