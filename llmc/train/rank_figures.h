// A rank's figures: bytes of memory per category and bytes sent in one step per communicator.
// The planner (llmc/planner/) predicts them for every rank of a mesh without running a step
// (--plan this); a run measures them (--plan-check FILE: the data-parallel memory table's
// allocator counts, the communicators' counted bytes). Both write the same line per rank, so
// test/test_planner.sh compares the two files byte for byte.
#pragma once

#include <stdio.h>
#include <stdint.h>

enum { FIG_PARAMS, FIG_GRADS, FIG_MASTER, FIG_OPTIM, FIG_ACTS, FIG_EXPERTS, FIG_NMEM };
static const char* FIG_MEM_NAMES[FIG_NMEM] = {"params", "grads", "master", "optim", "acts", "experts"};
enum { FIG_DP, FIG_TP, FIG_PP, FIG_PP_EMBED, FIG_CP, FIG_EP, FIG_EDP, FIG_NCOMM };
static const char* FIG_COMM_NAMES[FIG_NCOMM] = {"dp", "tp", "pp", "pp-embed", "cp", "ep", "edp"};

typedef struct {
    uint64_t mem[FIG_NMEM];
    uint64_t bytes[FIG_NCOMM];
} RankFigures;

static inline uint64_t figures_memory(const RankFigures* f) {
    uint64_t t = 0;
    for (int c = 0; c < FIG_NMEM; c++) { t += f->mem[c]; }
    return t;
}

// one line per rank, the format --plan this prints and --plan-check writes
static inline void figures_print(FILE* out, int rank, const RankFigures* f) {
    fprintf(out, "rank %d:", rank);
    for (int c = 0; c < FIG_NMEM; c++) { fprintf(out, " %s %llu", FIG_MEM_NAMES[c], (unsigned long long)f->mem[c]); }
    fprintf(out, " |");
    for (int c = 0; c < FIG_NCOMM; c++) { fprintf(out, " %s %llu", FIG_COMM_NAMES[c], (unsigned long long)f->bytes[c]); }
    fprintf(out, "\n");
}
