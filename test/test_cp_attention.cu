// The context-parallel attention op (llmc/parallel/cp.h) alone, against the single-rank attention
// (llmc/cpu/attention.h): outputs and input gradients, at odd segment lengths, for every
// algorithm (ring, allgather, alltoall) and both splits (zigzag, plain), on cp = the number of
// ranks. Run under mpirun with np = 2, 3, 4 (test/test_cp_attention.sh).
//
// Every rank builds the same random qkv (B, T, 3C) and dout (B, T, C) from a fixed seed, runs
// attention_forward / attention_backward on the whole sequences (the reference), takes its own
// rows of qkv and dout (segment s of rank r: local rows [s L, (s+1) L), global cp_seg_pos(r, s)),
// runs the cp op's forward and backward and compares its rows of out and dqkv with the
// reference's. Also per case: the bytes this rank sent over one forward + backward against
// cp_formula_layer_bytes_for, and (ring, allgather) the pairs the forward counted against
// cp_rank_pairs; per split: the attention work per rank (cp_rank_pairs: equal on every rank with
// the zigzag split, not with the plain one). Then each algorithm again with scores of order
// +-100 (lse far outside exp's range: the merge's max correction matters).
// One PASS/FAIL line per check (rank 0 prints; the verdicts are combined over the ranks, so
// every rank agrees); exit status 1 when any check failed.
//
//   mpirun -np 3 ./test_cp_attentioncpu
#ifndef USE_MPI
#include <stdio.h>
int main() {
    printf("test_cp_attention: built without MPI, nothing to test (install libopenmpi-dev)\n");
    return 0;
}
#else
#include <math.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../llmc/rand.h"
#include "../llmc/parallel/cp.h"

// Tolerance, relative to the largest magnitude of the reference tensor (out, resp. dqkv) over all
// ranks' rows. Everything is fp32 (eps = 1.2e-7). The cp op computes the same quantities in a
// different order: the softmax over the visible keys block by block, merged through log-sum-exp
// (exp and log each add ~1 ulp, the merge weights w_a, w_b and 1/(w_a + w_b) a few more), the
// backward's probabilities recomputed as exp(s - lse) from the final lse instead of read from
// the saved matrix, and dK, dV summed over the query blocks (and over the ranks) in another
// order. With unit-variance data, scores of order 1 and sums of at most T = 30 terms, each
// reordering changes a result by a few ulp of the largest term: ~1e-6 of the largest magnitude
// in the worst case (measured: 0.8e-7 to 2.7e-7 for ring and allgather, 0 for alltoall, which
// runs the same kernel on whole sequences). 1e-5 leaves that a >10x margin, while every real defect (a missing or repeated key block, a wrong causal
// position, a mis-merged partial, rows in the wrong place) changes results by O(1e-2) or more.
static const double TOL = 1e-5;

static Comm W;
static int failures = 0, checks = 0;

static std::string fmt(const char* f, double a, double b) {
    char buf[200];
    snprintf(buf, sizeof(buf), f, a, b);
    return buf;
}

// one verdict for all ranks: bad anywhere fails everywhere; rank 0 prints (its detail)
static void report(const std::string& name, int bad, const std::string& detail) {
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, W.mpi);
    checks++;
    if (bad) { failures++; }
    if (W.rank == 0) {
        printf("%s %s: %s\n", bad ? "FAIL" : "PASS", name.c_str(), detail.c_str());
        fflush(stdout);
    }
}

// max |a - b| and max |ref| over this rank's rows, then over every rank; a NaN or inf counts as
// an infinite error (the op writing nothing to some row leaves the NaN we filled it with)
static double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
    double err = 0.0, mag = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!std::isfinite(d)) { d = INFINITY; }
        err = std::max(err, d);
        mag = std::max(mag, fabs((double)ref[i]));
    }
    double m[2] = {err, mag};
    MPI_Allreduce(MPI_IN_PLACE, m, 2, MPI_DOUBLE, MPI_MAX, W.mpi);
    return m[1] > 0 ? m[0] / m[1] : m[0];
}

// this rank's rows of a (B, T, w) tensor: (B, Tl, w), segment by segment
static std::vector<float> my_rows(const ContextParallel* cp, const std::vector<float>& full, int B, int w) {
    std::vector<float> mine((size_t)B * cp->Tl * w);
    for (int b = 0; b < B; b++) {
        for (int s = 0; s < cp->nseg; s++) {
            const float* src = full.data() + ((size_t)b * cp->T + cp_seg_pos(cp, cp->rank, s)) * w;
            float* dst = mine.data() + ((size_t)b * cp->Tl + (size_t)s * cp->Tseg) * w;
            memcpy(dst, src, (size_t)cp->Tseg * w * sizeof(float));
        }
    }
    return mine;
}

static const char* split_name(int zigzag) { return zigzag ? "zigzag" : "plain"; }

// the largest |score| scale q_i . k_j over the visible (causal) pairs
static double max_score(const std::vector<float>& qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs), m = 0.0;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < T; i++) {
                for (int j = 0; j <= i; j++) {
                    const float* q = qkv.data() + ((size_t)b * T + i) * 3 * C + h * hs;
                    const float* k = qkv.data() + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double s = 0.0;
                    for (int c = 0; c < hs; c++) { s += (double)q[c] * k[c]; }
                    m = std::max(m, fabs(s * scale));
                }
            }
        }
    }
    return m;
}

// one algorithm, one split: out, dqkv, bytes. shift > 0: every key gets `shift` added to each
// channel, which adds to query i's scores the constant scale q_i . (shift, ..., shift), of
// standard deviation `shift` over the rows: the softmax is unchanged but lse is of order +-shift,
// and exp(lse) overflows (lse > 88.7) or underflows (lse < -103) for many rows, so a merge
// without the max correction gives inf / inf or 0 / 0.
static void test_case(CPAlgo algo, int zigzag, int T, int B, int C, int NH, float shift) {
    char name[160];
    snprintf(name, sizeof(name), "%s %s cp=%d T=%d L=%d B=%d C=%d NH=%d%s", CP_ALGO_NAMES[algo], split_name(zigzag), W.size,
             T, T / W.size / (zigzag ? 2 : 1), B, C, NH, shift > 0 ? " large scores" : "");
    // the same data on every rank: the seed depends on the case, not on the rank
    Rng rng;
    rng_init(&rng, 1000 + 97 * algo + 31 * zigzag + T + (shift > 0 ? 7 : 0));
    std::vector<float> qkv((size_t)B * T * 3 * C), dout((size_t)B * T * C);
    rng_normal(&rng, qkv.data(), qkv.size(), 0.0f, 1.0f);
    rng_normal(&rng, dout.data(), dout.size(), 0.0f, 1.0f);
    for (size_t row = 0; row < (size_t)B * T; row++) {
        for (int c = 0; c < C; c++) { qkv[row * 3 * C + C + c] += shift; }
    }
    // Unit-variance data: TOL. Large scores: scores and lse of magnitude smax are fp32 numbers
    // with an absolute rounding of ~smax eps, which the exponents s - lse (the backward's
    // probabilities) and the merge weights exp(lse_a - m) take as a relative error of each
    // probability and weight, and dq = scale sum_j dS_ij k_j cancels the keys' common part
    // (sum_j dS_ij = 0) only to that precision: TOL (~80 eps) times smax (measured: ~8 eps smax).
    double smax = max_score(qkv, B, T, C, NH), tol = shift > 0 ? TOL * smax : TOL;

    // the reference: the whole sequences on one rank
    std::vector<float> out_ref((size_t)B * T * C), dqkv_ref(qkv.size()), att(attention_state_size(B, T, NH));
    attention_forward(out_ref.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv_ref.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

    // the cp op on this rank's rows
    ContextParallel cp;   // on the world communicator; this case's bytes: the difference of its counter
    cp_setup(&cp, &W, algo, zigzag, T, B, C, NH, /*use_ring=*/1);
    int Tl = cp.Tl;
    std::vector<float> qkv_mine = my_rows(&cp, qkv, B, 3 * C), dout_mine = my_rows(&cp, dout, B, C);
    std::vector<float> out((size_t)B * Tl * C, NAN), dqkv((size_t)B * Tl * 3 * C, NAN);
    std::vector<float> state(cp_state_size_entry(algo)(&cp, B, Tl, C, NH), NAN);   // the op's own size
    OpAt at;
    memset(&at, 0, sizeof(at));
    at.layer = 0;
    at.B = B;
    at.T = at.Ts = Tl;
    uint64_t bytes0 = W.bytes_sent;
    if (algo == CP_ALLTOALL) {
        cp_a2a_forward(&cp, &at, out.data(), state.data(), qkv_mine.data(), C, NH);
        cp_a2a_backward(&cp, &at, dqkv.data(), dout_mine.data(), qkv_mine.data(), state.data(), C, NH);
    } else {
        (algo == CP_RING ? cp_ring_forward : cp_allgather_forward)(&cp, &at, out.data(), state.data(), qkv_mine.data(), C, NH);
        double fwd_pairs = cp.pairs_step;
        (algo == CP_RING ? cp_ring_backward : cp_allgather_backward)(&cp, &at, dqkv.data(), dout_mine.data(), qkv_mine.data(),
                                                                     state.data(), C, NH);
        if (shift == 0) {   // the pairs each rank's forward counted are the ones cp_rank_pairs says it computes
            std::vector<double> counted(cp.cp);
            MPI_Allgather(&fwd_pairs, 1, MPI_DOUBLE, counted.data(), 1, MPI_DOUBLE, W.mpi);
            std::string got = "forward", want = "cp_rank_pairs";
            int bad = 0;
            for (int r = 0; r < cp.cp; r++) {
                got += fmt(" r%.0f %.0f", r, counted[r]);
                want += fmt(" r%.0f %.0f", r, cp_rank_pairs(&cp, r));
                bad |= counted[r] != cp_rank_pairs(&cp, r);
            }
            report(std::string(name) + " pairs counted", bad, got + " (" + want + ")");
        }
    }
    uint64_t sent = W.bytes_sent - bytes0, want = cp_formula_layer_bytes_for(&cp, B, C);

    double e_out = relative_error(out, my_rows(&cp, out_ref, B, C));
    std::string at_scores = shift > 0 ? ", max |score| " + std::to_string((int)lround(smax)) : "";
    report(std::string(name) + " out", !(e_out <= tol), fmt("err %.2e (tol %.2g", e_out, tol) + at_scores + ")");
    double e_d = relative_error(dqkv, my_rows(&cp, dqkv_ref, B, 3 * C));
    report(std::string(name) + " dqkv", !(e_d <= tol), fmt("err %.2e (tol %.2g", e_d, tol) + at_scores + ")");
    if (shift == 0) {
        report(std::string(name) + " bytes", sent != want, fmt("sent %.0f by rank 0, formula %.0f", (double)sent, (double)want));
    }
    cp_free(&cp);
}

// the attention work of every rank (forward pairs per layer, sequence and head): the same on every
// rank with the zigzag split, rising with the rank with the plain one; together the whole causal
// triangle T (T + 1) / 2
static void test_pairs(int zigzag, int T, int B, int C, int NH) {
    ContextParallel cp;
    cp_setup(&cp, &W, CP_RING, zigzag, T, B, C, NH, 1);
    double lo = INFINITY, hi = 0.0, sum = 0.0;
    for (int r = 0; r < cp.cp; r++) {
        double n = cp_rank_pairs(&cp, r);
        lo = std::min(lo, n);
        hi = std::max(hi, n);
        sum += n;
    }
    int bad = sum != (double)T * (T + 1) / 2 || (zigzag ? hi != lo : !(hi > lo));
    char name[120];
    snprintf(name, sizeof(name), "pairs %s cp=%d T=%d (%s)", split_name(zigzag), cp.cp, T,
             zigzag ? "equal on every rank" : "unequal");
    report(name, bad, fmt("max/min %.3f, sum %.0f", lo > 0 ? hi / lo : INFINITY, sum));
    cp_free(&cp);
}

int main(int argc, char** argv) {
    W = comm_init_world(&argc, &argv);
    int p = W.size;
    if (p < 2 || p > 4) {
        if (W.rank == 0) { printf("FAIL test_cp_attention: run with 2, 3 or 4 ranks, got %d\n", p); }
        comm_finalize();
        return 1;
    }
    double t0 = MPI_Wtime();
    // odd segment lengths L; heads divisible by cp (alltoall) with hs = C/NH = 4 or 8
    const int T_zigzag[5] = {0, 0, 4 * 7, 6 * 5, 8 * 3};   // L = 7, 5, 3
    const int T_plain[5] = {0, 0, 2 * 7, 3 * 7, 4 * 7};    // L = 7
    const int Bs[5] = {0, 0, 3, 3, 2};
    int C = p == 4 ? 32 : 24, NH = p == 4 ? 4 : 6, B = Bs[p];
    for (int zigzag = 1; zigzag >= 0; zigzag--) {
        int T = zigzag ? T_zigzag[p] : T_plain[p];
        for (int a = 0; a < 3; a++) { test_case((CPAlgo)a, zigzag, T, B, C, NH, 0.0f); }
        test_pairs(zigzag, T, B, C, NH);
    }
    // lse far from 0 (the merge's max correction), on the zigzag split: both splits share the merge
    for (int a = 0; a < 3; a++) { test_case((CPAlgo)a, 1, T_zigzag[p], B, C, NH, 100.0f); }
    if (W.rank == 0) { printf("test_cp_attention cp=%d: %d checks, %d failed, %.2f s\n", p, checks, failures, MPI_Wtime() - t0); }
    comm_free(&W);
    comm_finalize();
    return failures ? 1 : 0;
}
#endif
