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
#include <ctype.h>
#include <math.h>
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

// A number of the file: the whole word (no "25x"), finite
static inline bool tuning_number(const std::string& w, double* v) {
    char* end = NULL;
    *v = strtod(w.c_str(), &end);
    return !w.empty() && (isdigit((unsigned char)w[0]) || w[0] == '.') && *end == 0 && isfinite(*v);
}
// A whole number of the file: digits only, at most `most`
static inline bool tuning_whole(const std::string& w, unsigned long long most, unsigned long long* v) {
    if (w.empty() || w.size() > 19 || strspn(w.c_str(), "0123456789") != w.size()) { return false; }
    *v = strtoull(w.c_str(), NULL, 10);
    return *v <= most;
}

// Parses the text of a tuning file, as strictly as the planner's --links file: every line a
// comment, a link (each at most once) or a row, every number a whole word, every row of one
// primitive, rank count and node size on sizes no other row of them covers. False with
// "line N: ..." in *err on the first bad line.
static inline bool tuning_parse(const std::string& text, CommTuning* T, std::string* err) {
    size_t pos = 0;
    int link_line[2] = {0, 0};
    std::vector<int> row_line;
    for (int line = 1; pos < text.size(); line++) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) { end = text.size(); }
        std::string l = text.substr(pos, end - pos);
        pos = end + 1;
        std::vector<std::string> w;
        std::vector<size_t> at;
        for (size_t i = 0; i < l.size();) {
            while (i < l.size() && isspace((unsigned char)l[i])) { i++; }
            size_t j = i;
            while (j < l.size() && !isspace((unsigned char)l[j])) { j++; }
            if (j > i) { w.push_back(l.substr(i, j - i)); at.push_back(i); }
            i = j;
        }
        if (w.empty() || w[0][0] == '#') { continue; }
        char buf[320];
        if (w[0] == "link") {
            int k = w.size() > 1 && w[1] == "inter";
            double a = -1, g = -1, x = -1;
            bool ok = w.size() >= 4 && (w[1] == "intra" || w[1] == "inter") && tuning_number(w[2], &a) && tuning_number(w[3], &g) &&
                      a >= 0 && g > 0 && (w.size() == 4 || (k && w.size() == 6 && tuning_number(w[4], &x) && x > 0 && w[5] == "shared"));
            if (!ok) {
                snprintf(buf, sizeof(buf), "line %d: want 'link intra|inter ALPHA_US GB_PER_S' or 'link inter ALPHA_US GB_PER_S "
                         "EXCHANGE_GB_PER_S shared' (alpha >= 0, bandwidths > 0), got '%.80s'", line, l.c_str());
                *err = buf;
                return false;
            }
            if (link_line[k]) {
                snprintf(buf, sizeof(buf), "line %d: the %s link again (first on line %d)", line, w[1].c_str(), link_line[k]);
                *err = buf;
                return false;
            }
            link_line[k] = line;
            if (!k) { T->have_intra = true; T->intra_alpha_us = a; T->intra_gbps = g; }
            else { T->have_inter = true; T->inter_alpha_us = a; T->inter_gbps = g; T->inter_x_gbps = x > 0 ? x : g; }
            continue;
        }
        TuneRow r;
        unsigned long long p = 0, node = 0, lo = 0, hi = 0;
        r.prim = w.size() >= 7 ? auto_prim_index(w[0]) : -1;
        bool ok = r.prim >= 0 && tuning_whole(w[1], 1 << 20, &p) && tuning_whole(w[2], 1 << 20, &node) && p >= 1 && node >= 1 &&
                  p % node == 0 && tuning_whole(w[3], 1ULL << 50, &lo) && tuning_whole(w[4], 1ULL << 50, &hi) && lo <= hi &&
                  (w[5] == "-" || auto_is_candidate(r.prim, w[5])) && auto_is_candidate(r.prim, w[6]);
        if (!ok) {
            snprintf(buf, sizeof(buf), "line %d: want 'PRIM RANKS NODE FROM TO PREDICTED MEASURED [WHY]' (whole numbers, NODE "
                     "dividing RANKS, FROM <= TO) with one of auto's algorithms, got '%.80s'", line, l.c_str());
            *err = buf;
            return false;
        }
        r.p = (int)p;
        r.node = (int)node;
        r.lo = (size_t)lo;
        r.hi = (size_t)hi;
        r.predicted = w[5];
        r.measured = w[6];
        if (w.size() > 7) { r.why = l.substr(at[7]); }
        for (size_t i = 0; i < T->rows.size(); i++) {
            const TuneRow& o = T->rows[i];
            if (o.prim == r.prim && o.p == r.p && o.node == r.node && !(r.hi < o.lo || o.hi < r.lo)) {
                snprintf(buf, sizeof(buf), "line %d: %s on %d ranks, sizes %zu to %zu, overlaps line %d's %zu to %zu", line,
                         w[0].c_str(), r.p, r.lo, r.hi, row_line[i], o.lo, o.hi);
                *err = buf;
                return false;
            }
        }
        T->rows.push_back(r);
        row_line.push_back(line);
    }
    return true;
}

// What auto needs from a file for a job of p ranks: rows for p (an empty file, or one measured
// for other rank counts only, would leave every choice to the formulas without a word). "" when
// it holds them, else what is missing.
static inline std::string tuning_covers(const CommTuning& T, int p) {
    std::string others;
    for (const TuneRow& r : T.rows) {
        if (r.p == p) { return ""; }
        std::string n = std::to_string(r.p);
        if ((" " + others + ",").find(" " + n + ",") == std::string::npos) { others += (others.empty() ? "" : ", ") + n; }
    }
    if (T.rows.empty() && !T.have_intra && !T.have_inter) { return "it holds no link and no row"; }
    return "it has no row for " + std::to_string(p) + " ranks (" + (others.empty() ? std::string("no rows at all") : "rows for " + others) +
           "): measure them with mpirun -np " + std::to_string(p) + " collbenchcpu --autotune -T FILE";
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
