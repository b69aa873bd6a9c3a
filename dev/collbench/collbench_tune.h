// collbench --autotune -T FILE: which of our algorithms is fastest, per size, predicted and measured,
// written to the tuning file the auto collectives read (llmc/comm/auto.h, llmc/comm/tuning.h).
// Part of collbench.cu (included before main; it uses the sweep's pieces).
//
// For all-reduce, reduce-scatter, all-gather and broadcast, at every size from -b to -e (x -f):
// native and each of auto's candidates timed (time_algos); the measured winner is our fastest,
// the predicted one the formulas' fastest (auto_predict) with the links measured at start-up.
// Two candidates within 2% of each other are a tie that the timing cannot split (runs on a
// shared machine differ by more): then the predicted one counts as the measured winner too.
// Where they differ, the formulas are extended one term at a time, and the first extension
// that predicts the measured winner names what they leave out:
//   1. the reduction's compute:  + gamma x the bytes a rank reduces (gamma: measured, local reduce)
//   2. the copies:               + delta x the bytes a rank copies (delta: measured, comm_copy)
//   3. neither: how the transport segments and progresses long messages, and caches (not modelled)
// One table per primitive on stdout; FILE keeps the rows of other rank counts and node sizes,
// this run's replace its own (the links too), and is written atomically.
#pragma once

static const double TUNE_TIE = 1.02;   // within 2% of the fastest: a tie

// delta: seconds per byte of comm_copy (16 MiB), as gamma is of the local reduce
static double measure_copy(const Comm* c) {
    const size_t n = ((size_t)16 << 20) / 4;
    float* a = (float*)comm_scratch(n, COMM_FP32);
    float* b = (float*)comm_scratch(n, COMM_FP32);
    for (size_t i = 0; i < n; i++) { b[i] = 1.0f; }
    double best = 1e30;
    for (int k = 0; k < 4; k++) {
        double t0 = MPI_Wtime();
        comm_copy(a, b, n, COMM_FP32);
        __asm__ __volatile__("" : : "r"(a) : "memory");    // the copy's result counts as used: not optimised away
        best = std::min(best, MPI_Wtime() - t0);
    }
    (void)c;
    free(a);
    free(b);
    return best / (double)(n * 4);
}

// What the formulas leave out, per rank, for S bytes (the code of each algorithm's file): bytes
// reduced locally, and bytes copied (out of place: the ring's all-reduce copies send to recv
// first; recursive doubling, Rabenseifner and halving let the first exchange land in the output;
// the reduce-scatters copy the last block out; Bruck rotates its result)
static void tune_extra(int prim, const std::string& a, double S, int p, int node, double* reduced, double* copied) {
    int p2 = 1 << ab_floor_log2(p);
    double fold = ab_pow2(p) ? 0.0 : S;                          // p not a power of two: one fold-in
    *reduced = 0;
    *copied = 0;
    if (prim == AUTO_ALLREDUCE) {
        if (a == "ring") { *reduced = (p - 1.0) / p * S; *copied = S; }
        if (a == "recursive_doubling") { *reduced = ab_floor_log2(p) * S + fold; }
        if (a == "rabenseifner") { *reduced = (p2 - 1.0) / p2 * S + fold; }
        if (a == "hierarchical") { int m = p / node; *reduced = (node - 1.0) / node * S + (m - 1.0) / m * S / node; *copied = S; }
    } else if (prim == AUTO_REDUCE_SCATTER) {
        *reduced = (p - 1.0) / p * S + (a == "ring" ? 0.0 : fold);
        *copied = S / p;
    } else if (prim == AUTO_ALLGATHER) {
        *copied = a == "bruck" ? S + S / p : S / p;
    }
}

struct TuneSize {
    size_t bytes;
    double native;                           // seconds
    std::vector<double> t;                   // per candidate (INFINITY: not a candidate here)
    std::string predicted, measured, why;
};

static std::string tune_why(int prim, const std::vector<std::string>& cand, const TuneSize& z, const CommLinks& L, int p,
                            double gamma, double delta) {
    char s[200];
    for (int term = 1; term <= 2; term++) {
        std::string best;
        double tb = INFINITY;
        for (size_t k = 0; k < cand.size(); k++) {
            if (!std::isfinite(z.t[k])) { continue; }
            double red, cp;
            tune_extra(prim, cand[k], (double)z.bytes, p, L.node, &red, &cp);
            double t = auto_model(prim, cand[k], L, (double)z.bytes, p, L.node) + gamma * red + (term == 2 ? delta * cp : 0.0);
            if (t < tb) { tb = t; best = cand[k]; }
        }
        if (best == z.measured) {
            double rw, rp, copied;    // bytes reduced by the measured and by the predicted winner
            tune_extra(prim, z.measured, (double)z.bytes, p, L.node, &rw, &copied);
            tune_extra(prim, z.predicted, (double)z.bytes, p, L.node, &rp, &copied);
            if (term == 1) {
                snprintf(s, sizeof(s), "the reduction's compute: %s reduces %.0f bytes, %s %.0f (gamma %.3f ns/B)",
                         z.measured.c_str(), rw, z.predicted.c_str(), rp, gamma * 1e9);
            } else {
                snprintf(s, sizeof(s), "the reduction's compute and the copies: with gamma %.3f and delta %.3f ns/B the "
                         "formulas pick %s", gamma * 1e9, delta * 1e9, z.measured.c_str());
            }
            return s;
        }
    }
    return "not in the formulas: how the transport segments and progresses long messages, and the caches";
}

static const Algo* find_algo(int prim, const std::string& name) {
    for (int i = 0; i < N_ALGOS; i++) { if ((int)ALGOS[i].prim == prim && name == ALGOS[i].name) { return &ALGOS[i]; } }
    return NULL;
}

// Sweeps one primitive, prints its table, appends its rows (sizes with the same predicted and
// measured winner and the same reason form one row) to T
static void tune_prim(Comm* c, int prim, Opts o, const CommLinks& L, const Nodes& nodes, double gamma, double delta,
                      void* sendbuf, void* recvbuf, CommTuning* T) {
    int p = c->size;
    o.prim = (Prim)prim;
    o.type = COMM_FP32;
    o.op = COMM_SUM;
    o.root = 0;
    std::vector<std::string> cand;
    for (const std::string& a : AUTO_CANDIDATES[prim]) {
        if (a == "hierarchical" && !(L.spans && L.node > 1 && L.node < p)) { continue; }
        cand.push_back(a);
    }
    std::vector<TuneSize> sizes;
    for (double bd = (double)o.minbytes; bd <= (double)o.maxbytes * (1 + 1e-9); bd *= o.factor) {
        TuneSize z;
        size_t count = std::max((size_t)bd / 4, (size_t)1);
        z.bytes = count * 4;
        std::vector<const Algo*> timed = {find_algo(prim, "native")};
        for (const std::string& a : cand) { timed.push_back(find_algo(prim, a)); }   // hierarchical: -N, the node size
        std::vector<double> t = time_algos(c, timed, sendbuf, recvbuf, count, o);   // their rounds in turn
        z.native = t[0];
        double tb = INFINITY;
        for (size_t i = 0; i < cand.size(); i++) {
            z.t.push_back(t[i + 1]);
            if (t[i + 1] < tb) { tb = t[i + 1]; z.measured = cand[i]; }
        }
        z.predicted = auto_predict(prim, L, (double)z.bytes, p);
        for (size_t i = 0; i < cand.size(); i++) {   // a tie within the noise: the formulas decide
            if (cand[i] == z.predicted && z.t[i] <= TUNE_TIE * tb) { z.measured = z.predicted; }
        }
        if (z.predicted != z.measured) { z.why = tune_why(prim, cand, z, L, p, gamma, delta); }
        sizes.push_back(z);
    }
    if (c->rank != 0) { return; }
    printf("#\n# --autotune %s on %d ranks%s: time (us) per algorithm; best = our fastest's busbw / native's\n", AUTO_PRIM_NAMES[prim], p,
           L.spans ? (" (" + std::to_string(nodes.count) + " nodes)").c_str() : "");
    printf("# %10s %10s", "size(B)", "native");
    for (const std::string& a : cand) { printf(" %19s", a.c_str()); }
    printf(" %5s  %-19s %-19s %s\n", "best", "predicted", "measured", "why they differ");
    for (const TuneSize& z : sizes) {
        printf("  %10zu %10.1f", z.bytes, z.native * 1e6);
        double tb = INFINITY;
        for (double t : z.t) { printf(" %19.1f", t * 1e6); tb = std::min(tb, t); }
        printf(" %5.2f  %-19s %-19s %s\n", z.native / tb, z.predicted.c_str(), z.measured.c_str(), z.why.c_str());
    }
    for (size_t i = 0; i < sizes.size();) {
        size_t j = i;
        while (j + 1 < sizes.size() && sizes[j + 1].predicted == sizes[i].predicted && sizes[j + 1].measured == sizes[i].measured &&
               (sizes[j + 1].why.empty() == sizes[i].why.empty())) { j++; }
        TuneRow r = {prim, p, L.spans ? L.node : p, sizes[i].bytes, sizes[j].bytes, sizes[i].predicted, sizes[i].measured, sizes[i].why};
        T->rows.push_back(r);
        i = j + 1;
    }
    fflush(stdout);
}

// --autotune -T FILE: every primitive auto serves, then FILE (rank 0)
static void tune_run(Comm* c, const Opts& o, const CommLinks& L, const Nodes& nodes, bool have_intra, double gamma) {
    int p = c->size;
    if (p < 2) { die("collbench: --autotune needs at least 2 ranks"); }
    double delta = measure_copy(c);
    if (c->rank == 0) {
        printf("# --autotune on %d ranks: alpha %.2f us, beta %.4f ns/B (%.2f GB/s)", p, L.a * 1e6, L.b * 1e9, 1e-9 / L.b);
        if (L.spans) { printf("; between nodes alpha' %.2f us, beta' %.4f ns/B, beta_x %.4f ns/B", L.a2 * 1e6, L.b2 * 1e9, L.bx * 1e9); }
        printf("; gamma (reduce) %.4f, delta (copy) %.4f ns/B\n", gamma * 1e9, delta * 1e9);
    }
    size_t max_count = std::max(o.maxbytes / 4, (size_t)1);
    void* sendbuf = bench_alloc(c, max_count, COMM_FP32);
    void* recvbuf = bench_alloc(c, max_count, COMM_FP32);
    void* host = comm_scratch(max_count, COMM_FP32);       // the data, filled on the host (device build: then copied over)
    fill(host, max_count, COMM_FP32, c->rank);
    bench_upload(c, sendbuf, host, max_count * 4);
    free(host);
    CommTuning T;                                           // this run's rows (rank 0 only)
    for (int prim = 0; prim < AUTO_NPRIM; prim++) { tune_prim(c, prim, o, L, nodes, gamma, delta, sendbuf, recvbuf, &T); }
    bench_free(sendbuf);
    bench_free(recvbuf);
    if (c->rank != 0) { return; }
    // the file's rows of other runs (another p or node size) stay; this run's links replace its
    CommTuning old;
    std::string text, err;
    if (FILE* f = fopen(o.tuning, "rb")) {
        char buf[4096];
        size_t k;
        while ((k = fread(buf, 1, sizeof(buf), f)) > 0) { text.append(buf, k); }
        fclose(f);
        if (!tuning_parse(text, &old, &err)) { die("collbench: --autotune: the existing file %s: %s (remove it)", o.tuning, err.c_str()); }
    }
    CommTuning out = old;
    out.rows.clear();
    int node = L.spans ? L.node : p;
    for (const TuneRow& r : old.rows) { if (!(r.p == p && r.node == node)) { out.rows.push_back(r); } }
    for (const TuneRow& r : T.rows) { out.rows.push_back(r); }
    if (have_intra) { out.have_intra = true; out.intra_alpha_us = L.a * 1e6; out.intra_gbps = 1e-9 / L.b; }
    if (L.spans) { out.have_inter = true; out.inter_alpha_us = L.a2 * 1e6; out.inter_gbps = 1e-9 / L.b2; out.inter_x_gbps = 1e-9 / L.bx; }
    char head[256];
    snprintf(head, sizeof(head), "# collbench --autotune: the fastest of our algorithms per size (llmc/comm/tuning.h); last run %d ranks, "
             "%d per node, gamma %.3f ns/B, delta %.3f ns/B\n", p, node, gamma * 1e9, delta * 1e9);
    tuning_write(o.tuning, out, head);
    printf("# tuning file written: %s (%zu rows for %d ranks, %zu in all)\n", o.tuning, T.rows.size(), p, out.rows.size());
}
