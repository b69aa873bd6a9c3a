// The tuning file: which of our algorithms is fastest, per primitive, rank count and size range,
// as collbench --autotune measured it on a machine; the auto collectives (auto.h) read it.
//
//   # collbench --autotune: ...                           comments
//   link intra 1.12 6.45                              the link inside a node: alpha (us), 1/beta (GB/s)
//   link inter 18.9 0.24 0.12 shared                  between nodes (when the ranks spanned nodes),
//                                                     and 1/beta_x, a pair exchanging both ways at once
//   allreduce 4 4 8 2048 recursive_doubling recursive_doubling
//   allreduce 4 4 4096 4194304 rabenseifner ring      copies: ...
//   PRIM RANKS NODE FROM TO PREDICTED MEASURED [WHY]
//
// PRIM: allreduce, reduce_scatter, allgather or broadcast. RANKS: p of the run; NODE: its ranks
// per node (= RANKS on one node). FROM and TO: the sizes the row covers (bytes of the full
// buffer, as collbench counts them; both measured). PREDICTED: the fastest by the formulas
// (alpha_beta.h) with the links above; MEASURED: the fastest measured, the one auto takes; WHY:
// where the two differ, which term the formulas leave out explains it.
#pragma once

#include <string>
#include <vector>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "alpha_beta.h"

typedef enum { AUTO_ALLREDUCE, AUTO_REDUCE_SCATTER, AUTO_ALLGATHER, AUTO_BROADCAST, AUTO_NPRIM } AutoPrim;
static const char* AUTO_PRIM_NAMES[AUTO_NPRIM] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};
// the algorithms auto chooses among, per primitive (hierarchical: only across nodes, from a file)
static const std::vector<std::string> AUTO_CANDIDATES[AUTO_NPRIM] = {
    {"ring", "recursive_doubling", "rabenseifner", "hierarchical"},
    {"ring", "recursive_halving"},
    {"ring", "recursive_doubling", "bruck"},
    {"ring", "tree"},
};

struct TuneRow {
    int prim, p, node;
    size_t lo, hi;
    std::string predicted, measured, why;
};
struct CommTuning {
    std::string source;                  // the file it came from ("" = none: the formulas decide)
    bool have_intra = false, have_inter = false;
    double intra_alpha_us = 0, intra_gbps = 0, inter_alpha_us = 0, inter_gbps = 0, inter_x_gbps = 0;
    std::vector<TuneRow> rows;
};

static inline int auto_prim_index(const std::string& name) {
    for (int k = 0; k < AUTO_NPRIM; k++) { if (name == AUTO_PRIM_NAMES[k]) { return k; } }
    return -1;
}
static inline bool auto_is_candidate(int prim, const std::string& algo) {
    for (const std::string& a : AUTO_CANDIDATES[prim]) { if (a == algo) { return true; } }
    return false;
}

// Parses the text of a tuning file; false with "line N: ..." in *err on the first bad line.
static inline bool tuning_parse(const std::string& text, CommTuning* T, std::string* err) {
    size_t pos = 0;
    for (int line = 1; pos < text.size(); line++) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) { end = text.size(); }
        std::string l = text.substr(pos, end - pos);
        pos = end + 1;
        char w[7][64] = {{0}};
        int why_at = 0;
        int n = sscanf(l.c_str(), "%63s %63s %63s %63s %63s %63s %63s %n", w[0], w[1], w[2], w[3], w[4], w[5], w[6], &why_at);
        if (n <= 0 || w[0][0] == '#') { continue; }
        char buf[256];
        if (strcmp(w[0], "link") == 0) {
            double a = atof(w[2]), g = atof(w[3]);
            if (n < 4 || !(a >= 0) || !(g > 0) || (strcmp(w[1], "intra") != 0 && strcmp(w[1], "inter") != 0)) {
                snprintf(buf, sizeof(buf), "line %d: want 'link intra|inter ALPHA_US GB_PER_S', got '%s'", line, l.c_str());
                *err = buf;
                return false;
            }
            if (strcmp(w[1], "intra") == 0) { T->have_intra = true; T->intra_alpha_us = a; T->intra_gbps = g; }
            else { T->have_inter = true; T->inter_alpha_us = a; T->inter_gbps = g; T->inter_x_gbps = n >= 5 && atof(w[4]) > 0 ? atof(w[4]) : g; }
            continue;
        }
        TuneRow r;
        r.prim = auto_prim_index(w[0]);
        char* e1 = NULL;
        char* e2 = NULL;
        r.p = atoi(w[1]);
        r.node = atoi(w[2]);
        r.lo = strtoull(w[3], &e1, 10);
        r.hi = strtoull(w[4], &e2, 10);
        r.predicted = w[5];
        r.measured = w[6];
        if (n < 7 || r.prim < 0 || r.p < 1 || r.node < 1 || r.p % r.node != 0 || *e1 || *e2 || r.lo > r.hi ||
            !auto_is_candidate(r.prim, r.measured)) {
            snprintf(buf, sizeof(buf), "line %d: want 'PRIM RANKS NODE FROM TO PREDICTED MEASURED [WHY]' with one of "
                     "auto's algorithms, got '%.80s'", line, l.c_str());
            *err = buf;
            return false;
        }
        if (why_at > 0 && why_at < (int)l.size()) { r.why = l.substr(why_at); }
        T->rows.push_back(r);
    }
    return true;
}

// Writes T to path, atomically (path.tmp, then renamed: a reader never sees half a file).
static inline void tuning_write(const char* path, const CommTuning& T, const std::string& header) {
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    fprintf(f, "%s", header.c_str());
    fprintf(f, "# link intra|inter ALPHA_US GB_PER_S [EXCHANGE_GB_PER_S]\n");
    if (T.have_intra) { fprintf(f, "link intra %.3f %.4g\n", T.intra_alpha_us, T.intra_gbps); }
    if (T.have_inter) { fprintf(f, "link inter %.3f %.4g %.4g shared\n", T.inter_alpha_us, T.inter_gbps, T.inter_x_gbps); }
    fprintf(f, "# PRIM RANKS NODE FROM TO PREDICTED MEASURED [WHY]\n");
    for (const TuneRow& r : T.rows) {
        fprintf(f, "%s %d %d %zu %zu %s %s%s%s\n", AUTO_PRIM_NAMES[r.prim], r.p, r.node, r.lo, r.hi, r.predicted.c_str(),
                r.measured.c_str(), r.why.empty() ? "" : " ", r.why.c_str());
    }
    fclose_and_rename(f, tmp, path);
}
