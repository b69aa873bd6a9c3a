// Every collective algorithm against the native MPI collective and against the result computed
// locally, bit for bit, and the bytes and messages each rank sent against the algorithm's
// formula. Run under mpirun for several rank counts (test/test_collectives.sh).
//
// Data are small integers (-8..8) that depend on (rank, index), so every rank can compute any
// rank's input, and sums over up to 8 ranks stay exact in fp32 and bf16 whatever the order of
// the additions. One PASS/FAIL line per (primitive, algorithm) and rank count.
//
//   mpirun -np 4 ./test_collectivescpu           the tests
//   mpirun -np 2 ./test_collectivescpu --bad X   one bad call (X = root, count, servers, node,
//                                                "leader node", grid, alltoallv): must die
#ifndef USE_MPI
#include <stdio.h>
int main() {
    printf("test_collectives: built without MPI, nothing to test (install libopenmpi-dev)\n");
    return 0;
}
#else
#include <functional>
#include <string>
#include <vector>
#include "../llmc/comm/native.h"
#include "../llmc/comm/ring.h"
#include "../llmc/comm/tree.h"
#include "../llmc/comm/recursive.h"
#include "../llmc/comm/alltoall.h"
#include "../llmc/comm/bruck.h"
#include "../llmc/comm/ps.h"
#include "../llmc/comm/hierarchical.h"
#include "../llmc/comm/torus.h"
#include "../llmc/comm/auto.h"

static Comm W;
static const CommType TYPES[] = {COMM_FP32, COMM_BF16, COMM_INT32};
static const CommOp OPS[] = {COMM_SUM, COMM_AVG, COMM_MAX, COMM_MIN};
// The large count: over RING_BROADCAST_CHUNK_BYTES (256 KiB) in every type, so the chunked ring
// broadcast sends several chunks and a partial last one (fp32 4, bf16 2), and not divisible by
// any p tested (1, 2, 3, 4, 5, 8), so every block split has a remainder. No algorithm has another
// size threshold (llmc/comm/), so a larger count would take no other path, only longer.
static const size_t BIG = 200003;

// --- data

static int value(int rank, size_t i, int salt) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(rank * 40503 + salt * 9176 + 1);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return (int)(h % 17) - 8;
}

static void store(void* buf, size_t i, CommType t, double x) {
    if (t == COMM_FP32) { ((float*)buf)[i] = (float)x; }
    else if (t == COMM_INT32) { ((int32_t*)buf)[i] = (int32_t)x; }
    else { ((uint16_t*)buf)[i] = float_to_bf16((float)x); }
}

// buf[0..n) = rank's input elements first..first+n
static void fill(void* buf, size_t first, size_t n, CommType t, int rank, int salt) {
    for (size_t i = 0; i < n; i++) { store(buf, i, t, value(rank, first + i, salt)); }
}

// buf[0..n) = the reduction over all ranks of elements first..first+n, as comm.h defines it
static void expect_reduced(void* buf, size_t first, size_t n, CommType t, CommOp op, int salt) {
    int p = W.size;
    for (size_t i = 0; i < n; i++) {
        int acc = value(0, first + i, salt);
        for (int r = 1; r < p; r++) {
            int x = value(r, first + i, salt);
            acc = op == COMM_MAX ? (x > acc ? x : acc) : op == COMM_MIN ? (x < acc ? x : acc) : acc + x;
        }
        store(buf, i, t, acc);
    }
    comm_avg_finish(buf, n, t, op, p);
}

static void* garbage(size_t n, CommType t) {
    void* b = comm_scratch(n, t);
    memset(b, 0x7b, n == 0 ? 1 : n * comm_type_size(t));
    return b;
}
static bool same(const void* a, const void* b, size_t n, CommType t) {
    return n == 0 || memcmp(a, b, n * comm_type_size(t)) == 0;
}

// --- one group of cases = one PASS/FAIL line

struct Group {
    std::string name;
    long cases = 0, failed = 0;
    std::string first;
};

__attribute__((format(printf, 3, 4)))
static void record(Group& g, bool ok, const char* fmt, ...) {
    g.cases++;
    if (ok) { return; }
    if (g.failed++ == 0) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        g.first = msg;
    }
}

static int total_failed_groups = 0;
static double last_report = 0;   // wall_seconds() at the last report: each line shows its group's time

static void report(Group& g) {
    long failed = g.failed;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_LONG, MPI_SUM, W.mpi);
    if (g.failed > 0) { fprintf(stderr, "  rank %d, first failure: %s\n", W.rank, g.first.c_str()); }
    fflush(stderr);
    MPI_Barrier(W.mpi);
    if (W.rank == 0) {
        if (failed == 0) {
            printf("PASS %s p=%d (%ld cases, %.1f s)\n", g.name.c_str(), W.size, g.cases, wall_seconds() - last_report);
        } else {
            printf("FAIL %s p=%d: %ld failures in %ld cases x %d ranks\n", g.name.c_str(), W.size, failed, g.cases, W.size);
        }
        fflush(stdout);
    }
    total_failed_groups += failed > 0;
    last_report = wall_seconds();
}

static std::vector<size_t> small_counts() {
    size_t p = (size_t)W.size;
    return {0, 1, p - 1, p, 2 * p + 1, 1009};
}

// --- all-reduce, reduce-scatter, all-gather

typedef void (*ReduceFn)(Comm*, const void*, void*, size_t, CommType, CommOp);
typedef void (*GatherFn)(Comm*, const void*, void*, size_t, CommType);
typedef CommVolume (*VolumeFn)(size_t, CommType, int, int);
static CommVolume no_volume(size_t, CommType, int, int) { return {0, 0}; }   // MPI's own traffic is not counted

// sends: the counters must have grown by exactly the formula
static bool volume_ok(const CommVolume& before, const CommVolume& want, std::string* why) {
    uint64_t b = W.bytes_sent - before.bytes, m = W.messages_sent - before.messages;
    if (b == want.bytes && m == want.messages) { return true; }
    char s[160];
    snprintf(s, sizeof(s), "sent %llu bytes in %llu messages, formula says %llu in %llu",
             (unsigned long long)b, (unsigned long long)m, (unsigned long long)want.bytes, (unsigned long long)want.messages);
    *why = s;
    return false;
}

// full = false, to keep the run short: counts {0, 1, p-1, p, 1009 (prime), BIG}, the BIG one
// only for fp32 sum
static void test_allreduce(const char* algo, ReduceFn fn, VolumeFn vol, bool full = true) {
    Group g;
    g.name = std::string("allreduce ") + algo;
    std::vector<size_t> counts = small_counts();
    counts.push_back(BIG);
    for (CommType t : TYPES) for (CommOp op : OPS) for (size_t n : counts) for (int in_place = 0; in_place < 2; in_place++) {
        if (!full && n == BIG && (t != COMM_FP32 || op != COMM_SUM)) { continue; }
        if (!full && n == 2 * (size_t)W.size + 1) { continue; }
        int salt = (int)n + 7 * op + 31 * t;
        void* send = comm_scratch(n, t);
        fill(send, 0, n, t, W.rank, salt);
        void* want = comm_scratch(n, t);
        expect_reduced(want, 0, n, t, op, salt);
        void* nat = garbage(n, t);
        allreduce_native(&W, send, nat, n, t, op);
        void* out = in_place ? send : garbage(n, t);
        CommVolume before = {W.bytes_sent, W.messages_sent};
        fn(&W, send, out, n, t, op);
        std::string why;
        bool ok = volume_ok(before, vol(n, t, W.size, W.rank), &why);
        void* orig = comm_scratch(n, t);
        fill(orig, 0, n, t, W.rank, salt);
        if (!in_place && !same(send, orig, n, t)) { ok = false; why = "modified its send buffer"; }
        if (!same(nat, want, n, t)) { ok = false; why = "native result differs from the expected one"; }
        if (!same(out, nat, n, t)) { ok = false; why = "result differs from allreduce_native"; }
        record(g, ok, "%s %s count %zu %s: %s", comm_type_name(t), comm_op_name(op), n,
               in_place ? "in place" : "out of place", why.c_str());
        free(send); free(want); free(nat); free(orig);
        if (!in_place) { free(out); }
    }
    report(g);
}

static void test_reduce_scatter(const char* algo, ReduceFn fn, VolumeFn vol) {
    Group g;
    g.name = std::string("reduce_scatter ") + algo;
    std::vector<size_t> counts = small_counts();
    counts.push_back(BIG);
    int p = W.size, r = W.rank;
    for (CommType t : TYPES) for (CommOp op : OPS) for (size_t n : counts) for (int in_place = 0; in_place < 2; in_place++) {
        int salt = (int)n + 7 * op + 31 * t + 1;
        size_t off = comm_block_offset(n, p, r), mine = comm_block_count(n, p, r);
        void* send = comm_scratch(n, t);
        fill(send, 0, n, t, r, salt);
        void* want = comm_scratch(mine, t);
        expect_reduced(want, off, mine, t, op, salt);
        void* nat = garbage(mine, t);
        reduce_scatter_native(&W, send, nat, n, t, op);
        void* out = in_place ? comm_at(send, off, t) : garbage(mine, t);
        CommVolume before = {W.bytes_sent, W.messages_sent};
        fn(&W, send, out, n, t, op);
        std::string why;
        bool ok = volume_ok(before, vol(n, t, p, r), &why);
        if (!same(nat, want, mine, t)) { ok = false; why = "native result differs from the expected one"; }
        if (!same(out, nat, mine, t)) { ok = false; why = "result differs from reduce_scatter_native"; }
        record(g, ok, "%s %s count %zu %s: %s", comm_type_name(t), comm_op_name(op), n,
               in_place ? "in place" : "out of place", why.c_str());
        free(send); free(want); free(nat);
        if (!in_place) { free(out); }
    }
    report(g);
}

static void test_allgather(const char* algo, GatherFn fn, VolumeFn vol) {
    Group g;
    g.name = std::string("allgather ") + algo;
    std::vector<size_t> counts = small_counts();
    counts.push_back(BIG);
    int p = W.size, r = W.rank;
    for (CommType t : TYPES) for (size_t n : counts) for (int in_place = 0; in_place < 2; in_place++) {
        int salt = (int)n + 31 * t + 2;
        size_t off = comm_block_offset(n, p, r), mine = comm_block_count(n, p, r);
        void* want = comm_scratch(n, t);
        for (int q = 0; q < p; q++) {
            fill(comm_at(want, comm_block_offset(n, p, q), t), comm_block_offset(n, p, q), comm_block_count(n, p, q), t, q, salt);
        }
        void* send = comm_scratch(mine, t);
        fill(send, off, mine, t, r, salt);
        void* nat = garbage(n, t);
        allgather_native(&W, send, nat, n, t);
        void* out = garbage(n, t);
        if (in_place) { comm_copy(comm_at(out, off, t), send, mine, t); }
        CommVolume before = {W.bytes_sent, W.messages_sent};
        fn(&W, in_place ? comm_at(out, off, t) : send, out, n, t);
        std::string why;
        bool ok = volume_ok(before, vol(n, t, p, r), &why);
        if (!same(nat, want, n, t)) { ok = false; why = "native result differs from the expected one"; }
        if (!same(out, nat, n, t)) { ok = false; why = "result differs from allgather_native"; }
        record(g, ok, "%s count %zu %s: %s", comm_type_name(t), n, in_place ? "in place" : "out of place", why.c_str());
        free(send); free(want); free(nat); free(out);
    }
    report(g);
}

// --- broadcast and reduce, every root

typedef void (*BroadcastFn)(Comm*, void*, size_t, CommType, int);
typedef CommVolume (*RootVolumeFn)(size_t, CommType, int, int, int);
static CommVolume no_root_volume(size_t, CommType, int, int, int) { return {0, 0}; }

static void broadcast_ring_small_chunks(Comm* c, void* buf, size_t n, CommType t, int root) { broadcast_ring_chunked(c, buf, n, t, root, 7); }
static CommVolume broadcast_ring_default_volume(size_t n, CommType t, int p, int r, int root) { return broadcast_ring_volume(n, t, p, r, root, 0); }
static CommVolume broadcast_ring_small_volume(size_t n, CommType t, int p, int r, int root) { return broadcast_ring_volume(n, t, p, r, root, 7); }

static void test_broadcast(const char* algo, BroadcastFn fn, RootVolumeFn vol) {
    Group g;
    g.name = std::string("broadcast ") + algo;
    std::vector<size_t> counts = small_counts();
    counts.push_back(BIG);
    for (CommType t : TYPES) for (size_t n : counts) for (int root = 0; root < W.size; root++) {
        if (n == BIG && root > 1) { continue; }
        int salt = (int)n + 31 * t + 3 + root;
        void* want = comm_scratch(n, t);
        fill(want, 0, n, t, root, salt);
        void* nat = garbage(n, t);
        if (W.rank == root) { comm_copy(nat, want, n, t); }
        broadcast_native(&W, nat, n, t, root);
        void* out = garbage(n, t);
        if (W.rank == root) { comm_copy(out, want, n, t); }
        CommVolume before = {W.bytes_sent, W.messages_sent};
        fn(&W, out, n, t, root);
        std::string why;
        bool ok = volume_ok(before, vol(n, t, W.size, W.rank, root), &why);
        if (!same(nat, want, n, t)) { ok = false; why = "native result differs from the expected one"; }
        if (!same(out, nat, n, t)) { ok = false; why = "result differs from broadcast_native"; }
        record(g, ok, "%s count %zu root %d: %s", comm_type_name(t), n, root, why.c_str());
        free(want); free(nat); free(out);
    }
    report(g);
}

typedef void (*RootReduceFn)(Comm*, const void*, void*, size_t, CommType, CommOp, int);

static void test_reduce(const char* algo, RootReduceFn fn, RootVolumeFn vol) {
    Group g;
    g.name = std::string("reduce ") + algo;
    std::vector<size_t> counts = small_counts();
    for (CommType t : TYPES) for (CommOp op : OPS) for (size_t n : counts) for (int root = 0; root < W.size; root++)
    for (int in_place = 0; in_place < 2; in_place++) {
        int salt = (int)n + 7 * op + 31 * t + 4 + root;
        bool at_root = W.rank == root;
        void* send = comm_scratch(n, t);
        fill(send, 0, n, t, W.rank, salt);
        void* want = comm_scratch(n, t);
        expect_reduced(want, 0, n, t, op, salt);
        void* nat = garbage(n, t);
        reduce_native(&W, send, nat, n, t, op, root);
        void* out = in_place ? send : garbage(n, t);
        CommVolume before = {W.bytes_sent, W.messages_sent};
        fn(&W, send, out, n, t, op, root);
        std::string why;
        bool ok = volume_ok(before, vol(n, t, W.size, W.rank, root), &why);
        if (at_root && !same(nat, want, n, t)) { ok = false; why = "native result differs from the expected one"; }
        if (at_root && !same(out, nat, n, t)) { ok = false; why = "result differs from reduce_native"; }
        record(g, ok, "%s %s count %zu root %d %s: %s", comm_type_name(t), comm_op_name(op), n, root,
               in_place ? "in place" : "out of place", why.c_str());
        free(send); free(want); free(nat);
        if (!in_place) { free(out); }
    }
    report(g);
}

static void reduce_native_fn(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op, int root) { reduce_native(c, s, r, n, t, op, root); }

// --- the native-only primitives, against the locally computed result

static void test_gather_scatter() {
    int p = W.size, r = W.rank;
    Group g;
    g.name = "gather native";
    for (CommType t : TYPES) for (size_t n : small_counts()) for (int root = 0; root < p; root++) for (int in_place = 0; in_place < 2; in_place++) {
        int salt = (int)n + 31 * t + 5 + root;
        size_t off = comm_block_offset(n, p, r), mine = comm_block_count(n, p, r);
        void* want = comm_scratch(n, t);
        for (int q = 0; q < p; q++) {
            fill(comm_at(want, comm_block_offset(n, p, q), t), comm_block_offset(n, p, q), comm_block_count(n, p, q), t, q, salt);
        }
        void* out = garbage(n, t);
        void* send = comm_scratch(mine, t);
        fill(send, off, mine, t, r, salt);
        bool ip = in_place && r == root;
        if (ip) { comm_copy(comm_at(out, off, t), send, mine, t); }
        gather_native(&W, ip ? comm_at(out, off, t) : send, out, n, t, root);
        record(g, r != root || same(out, want, n, t), "%s count %zu root %d%s: wrong result",
               comm_type_name(t), n, root, in_place ? " in place" : "");
        free(want); free(out); free(send);
    }
    report(g);
    Group s;
    s.name = "scatter native";
    for (CommType t : TYPES) for (size_t n : small_counts()) for (int root = 0; root < p; root++) for (int in_place = 0; in_place < 2; in_place++) {
        int salt = (int)n + 31 * t + 6 + root;
        size_t off = comm_block_offset(n, p, r), mine = comm_block_count(n, p, r);
        void* full = comm_scratch(n, t);
        fill(full, 0, n, t, root, salt);
        void* want = comm_scratch(mine, t);
        fill(want, off, mine, t, root, salt);
        bool ip = in_place && r == root;
        void* out = ip ? comm_at(full, off, t) : garbage(mine, t);
        scatter_native(&W, full, out, n, t, root);
        record(s, same(out, want, mine, t), "%s count %zu root %d%s: wrong result", comm_type_name(t), n, root,
               in_place ? " in place" : "");
        free(full); free(want);
        if (!ip) { free(out); }
    }
    report(s);
}

// One all-to-all-v case: amount(from, to) elements go from rank `from` to rank `to`. Builds
// this rank's counts and displacements, its send buffer and the result it must receive.
struct AlltoallvCase {
    std::vector<size_t> sc, sd, rc, rd;   // send/recv counts and displacements, per peer
    size_t stotal = 0, rtotal = 0;
    void* send = NULL;
    void* want = NULL;
};
static AlltoallvCase alltoallv_case(const std::function<size_t(int, int)>& amount, CommType t, int salt) {
    int p = W.size, r = W.rank;
    AlltoallvCase v;
    v.sc.resize(p); v.sd.resize(p); v.rc.resize(p); v.rd.resize(p);
    for (int j = 0; j < p; j++) {
        v.sc[j] = amount(r, j); v.sd[j] = v.stotal; v.stotal += v.sc[j];
        v.rc[j] = amount(j, r); v.rd[j] = v.rtotal; v.rtotal += v.rc[j];
    }
    v.send = comm_scratch(v.stotal, t);
    fill(v.send, 0, v.stotal, t, r, salt);
    v.want = comm_scratch(v.rtotal, t);
    for (int q = 0; q < p; q++) {
        size_t first = 0;   // where rank q's block for r starts in q's send buffer
        for (int j = 0; j < r; j++) { first += amount(q, j); }
        fill(comm_at(v.want, v.rd[q], t), first, v.rc[q], t, q, salt);
    }
    return v;
}

static void test_alltoall() {
    int p = W.size, r = W.rank;
    Group g;
    g.name = "alltoall native";
    for (CommType t : TYPES) for (size_t n : small_counts()) for (int in_place = 0; in_place < 2; in_place++) {
        int salt = (int)n + 31 * t + 8;
        // rank q's send block j holds value(q, j * n + i)
        void* send = comm_scratch(n * p, t);
        fill(send, 0, n * p, t, r, salt);
        void* want = comm_scratch(n * p, t);
        for (int q = 0; q < p; q++) { fill(comm_at(want, q * n, t), r * n, n, t, q, salt); }
        void* out = in_place ? send : garbage(n * p, t);
        alltoall_native(&W, send, out, n, t);
        record(g, same(out, want, n * p, t), "%s count %zu%s: wrong result", comm_type_name(t), n, in_place ? " in place" : "");
        free(send); free(want);
        if (!in_place) { free(out); }
    }
    report(g);
    // all-to-all-v: rank q sends (q + j) % 3 * k elements to rank j, k from the counts list
    Group v;
    v.name = "alltoallv native";
    for (CommType t : TYPES) for (size_t k : small_counts()) {
        int salt = (int)k + 31 * t + 9;
        auto amount = [&](int from, int to) { return (size_t)((from + to) % 3) * k; };
        AlltoallvCase c = alltoallv_case(amount, t, salt);
        const std::vector<size_t>&sc = c.sc, &sd = c.sd, &rc = c.rc, &rd = c.rd;
        size_t rtotal = c.rtotal;
        void* send = c.send;
        void* want = c.want;
        void* out = garbage(rtotal, t);
        alltoallv_native(&W, send, sc.data(), sd.data(), out, rc.data(), rd.data(), t);
        record(v, same(out, want, rtotal, t), "%s k %zu: wrong result", comm_type_name(t), k);
        free(send); free(want); free(out);
    }
    report(v);
}

// --- the educational all-to-alls against alltoall_native

static void test_alltoall_algo(const char* algo, GatherFn fn, VolumeFn vol) {
    int p = W.size, r = W.rank;
    Group g;
    g.name = std::string("alltoall ") + algo;
    std::vector<size_t> counts = small_counts();
    counts.push_back(BIG / p);   // BIG elements in all
    for (CommType t : TYPES) for (size_t n : counts) for (int in_place = 0; in_place < 2; in_place++) {
        int salt = (int)n + 31 * t + 10;
        void* send = comm_scratch(n * p, t);
        fill(send, 0, n * p, t, r, salt);
        void* want = comm_scratch(n * p, t);
        for (int q = 0; q < p; q++) { fill(comm_at(want, q * n, t), r * n, n, t, q, salt); }
        void* nat = garbage(n * p, t);
        alltoall_native(&W, send, nat, n, t);
        void* out = in_place ? send : garbage(n * p, t);
        CommVolume before = {W.bytes_sent, W.messages_sent};
        fn(&W, send, out, n, t);
        std::string why;
        bool ok = volume_ok(before, vol(n, t, p, r), &why);
        void* orig = comm_scratch(n * p, t);
        fill(orig, 0, n * p, t, r, salt);
        if (!in_place && !same(send, orig, n * p, t)) { ok = false; why = "modified its send buffer"; }
        if (!same(nat, want, n * p, t)) { ok = false; why = "native result differs from the expected one"; }
        if (!same(out, nat, n * p, t)) { ok = false; why = "result differs from alltoall_native"; }
        record(g, ok, "%s count %zu %s: %s", comm_type_name(t), n, in_place ? "in place" : "out of place", why.c_str());
        free(send); free(want); free(nat); free(orig);
        if (!in_place) { free(out); }
    }
    report(g);
}

// all-to-all-v with random per-peer counts (a quarter of them zero), the same on every rank
static void test_alltoallv_pairwise() {
    int p = W.size, r = W.rank;
    Group g;
    g.name = "alltoallv pairwise";
    const size_t maxima[] = {0, 1, (size_t)p, 1009, 2 * BIG / ((size_t)p * p)};
    for (CommType t : TYPES) for (size_t k : maxima) for (int trial = 0; trial < 3; trial++) {
        int salt = (int)k + 31 * t + 11 + 97 * trial;
        auto amount = [&](int from, int to) -> size_t {
            uint32_t h = (uint32_t)(from * 131 + to * 7 + salt) * 2654435761u;
            h ^= h >> 16;
            return h % 4 == 0 ? 0 : (size_t)(h >> 2) % (k + 1);
        };
        AlltoallvCase c = alltoallv_case(amount, t, salt);
        const std::vector<size_t>&sc = c.sc, &sd = c.sd, &rc = c.rc, &rd = c.rd;
        size_t rtotal = c.rtotal;
        void* send = c.send;
        void* want = c.want;
        void* nat = garbage(rtotal, t);
        alltoallv_native(&W, send, sc.data(), sd.data(), nat, rc.data(), rd.data(), t);
        void* out = garbage(rtotal, t);
        CommVolume before = {W.bytes_sent, W.messages_sent};
        alltoallv_pairwise(&W, send, sc.data(), sd.data(), out, rc.data(), rd.data(), t);
        std::string why;
        bool ok = volume_ok(before, alltoallv_pairwise_volume(sc.data(), t, p, r), &why);
        if (!same(nat, want, rtotal, t)) { ok = false; why = "native result differs from the expected one"; }
        if (!same(out, nat, rtotal, t)) { ok = false; why = "result differs from alltoallv_native"; }
        record(g, ok, "%s max %zu trial %d: %s", comm_type_name(t), k, trial, why.c_str());
        free(send); free(want); free(nat); free(out);
    }
    report(g);
}

// --- parameter server, hierarchical (both variants) and torus: algorithm parameters through globals

static int g_servers = 1, g_node = 1, g_rows = 1, g_cols = 1;
static HierInter g_inter = HIER_INTER_RING;

static void allreduce_ps_fn(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    allreduce_parameter_server(c, s, r, n, t, op, g_servers);
}
static CommVolume allreduce_ps_vol(size_t n, CommType t, int p, int r) { return allreduce_parameter_server_volume(n, t, p, r, g_servers); }
// most calls through a plan made once per group (as a trainer would), every 4th through
// allreduce_hierarchical, which splits the communicator itself
static HierPlan g_plan;
static long g_hier_calls = 0;
static void allreduce_hier_fn(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    if (g_hier_calls++ % 4 == 0) {
        allreduce_hierarchical(c, s, r, n, t, op, g_node, g_inter);
    } else {
        allreduce_hierarchical_plan(c, &g_plan, s, r, n, t, op, g_inter);
    }
}
static CommVolume allreduce_hier_vol(size_t n, CommType t, int p, int r) { return allreduce_hierarchical_volume(n, t, p, r, g_node, g_inter); }
// the leader variant (reduce -> all-reduce -> broadcast), on the same plan, with the same mix
static void allreduce_leader_fn(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    if (g_hier_calls++ % 4 == 0) {
        allreduce_hierarchical_leader(c, s, r, n, t, op, g_node, g_inter);
    } else {
        allreduce_hierarchical_leader_plan(c, &g_plan, s, r, n, t, op, g_inter);
    }
}
static CommVolume allreduce_leader_vol(size_t n, CommType t, int p, int r) {
    return allreduce_hierarchical_leader_volume(n, t, p, r, g_node, g_inter);
}
static void allreduce_torus_fn(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    allreduce_torus2d(c, s, r, n, t, op, g_rows, g_cols);
}
static CommVolume allreduce_torus_vol(size_t n, CommType t, int p, int r) { return allreduce_torus2d_volume(n, t, p, r, g_rows, g_cols); }

// the parameter server's formulas: what all ranks send is what all ranks receive, and a
// server receives (p-1) times its slice while a worker receives the whole buffer once
static void test_parameter_server_formulas() {
    int p = W.size;
    Group g;
    g.name = "parameter_server volume formulas";
    for (size_t n : small_counts()) for (int S = 1; S <= p; S++) {
        uint64_t sent = 0, received = 0, ms = 0, mr = 0;
        for (int r = 0; r < p; r++) {
            CommVolume a = allreduce_parameter_server_volume(n, COMM_FP32, p, r, S);
            CommVolume b = allreduce_parameter_server_received(n, COMM_FP32, p, r, S);
            sent += a.bytes; ms += a.messages; received += b.bytes; mr += b.messages;
        }
        record(g, sent == received && ms == mr, "count %zu S %d: sent %llu bytes, received %llu", n, S,
               (unsigned long long)sent, (unsigned long long)received);
        if (n > 0 && p > 1) {
            CommVolume server = allreduce_parameter_server_received(n, COMM_FP32, p, 0, 1);
            CommVolume worker = allreduce_parameter_server_received(n, COMM_FP32, p, p - 1, 1);
            record(g, server.bytes == (uint64_t)(p - 1) * n * 4 && worker.bytes == n * 4,
                   "count %zu S=1: server receives %llu, worker %llu", n, (unsigned long long)server.bytes,
                   (unsigned long long)worker.bytes);
        }
    }
    report(g);
}

// Degenerate shapes (node size 1 or p, grid 1 x p) reduce to the flat ring and are tested only
// where p is prime and nothing else exists; the BIG count only for fp32 sum and max.
static void test_new_allreduces() {
    int p = W.size;
    std::vector<int> servers = {1};              // one server, every rank a server, and 2 for odd p
    if (p > 1) { servers.push_back(p); }
    if (p > 2 && p % 2 == 1) { servers.push_back(2); }
    for (int S : servers) {
        g_servers = S;
        std::string name = "parameter_server S=" + std::to_string(S);
        test_allreduce(name.c_str(), allreduce_ps_fn, allreduce_ps_vol, false);
    }
    bool recursive_done = false;
    for (int n = 2; n < p; n++) {
        if (p % n != 0) { continue; }
        for (HierInter inter : {HIER_INTER_RING, HIER_INTER_RECURSIVE_DOUBLING}) {
            if (inter == HIER_INTER_RECURSIVE_DOUBLING && recursive_done) { continue; }
            recursive_done = recursive_done || inter == HIER_INTER_RECURSIVE_DOUBLING;
            g_node = n;
            g_inter = inter;
            std::string shape = "node=" + std::to_string(n) + " inter=" + hier_inter_name(inter);
            g_plan = hier_plan_make(&W, "test", n);
            test_allreduce(("hierarchical " + shape).c_str(), allreduce_hier_fn, allreduce_hier_vol, false);
            test_allreduce(("hierarchical_leader " + shape).c_str(), allreduce_leader_fn, allreduce_leader_vol, false);
            hier_plan_free(&g_plan);
        }
    }
    if (!recursive_done) {   // p prime (or 1): the two degenerate shapes
        g_node = p; g_inter = HIER_INTER_RING;
        g_plan = hier_plan_make(&W, "test", g_node);
        test_allreduce(("hierarchical node=" + std::to_string(p) + " inter=ring").c_str(), allreduce_hier_fn, allreduce_hier_vol, false);
        test_allreduce(("hierarchical_leader node=" + std::to_string(p) + " inter=ring").c_str(), allreduce_leader_fn, allreduce_leader_vol, false);
        hier_plan_free(&g_plan);
        g_node = 1; g_inter = HIER_INTER_RECURSIVE_DOUBLING;
        g_plan = hier_plan_make(&W, "test", g_node);
        test_allreduce("hierarchical node=1 inter=recursive_doubling", allreduce_hier_fn, allreduce_hier_vol, false);
        test_allreduce("hierarchical_leader node=1 inter=recursive_doubling", allreduce_leader_fn, allreduce_leader_vol, false);
        hier_plan_free(&g_plan);
    }
    for (int rows = 1; rows <= p; rows++) {
        if (p % rows != 0 || ((rows == 1 || rows == p) && !(rows == 1 && !recursive_done))) { continue; }
        g_rows = rows;
        g_cols = p / rows;
        std::string name = "torus2d " + std::to_string(rows) + "x" + std::to_string(p / rows);
        test_allreduce(name.c_str(), allreduce_torus_fn, allreduce_torus_vol, false);
    }
}

static void test_counts_and_split() {
    // the balanced split covers [0, count) exactly, blocks differ by at most one, and sub-groups
    // made with comm_split see the right ranks
    Group g;
    g.name = "block split and comm_split";
    for (size_t n : {0, 1, 5, 1009}) for (int p = 1; p <= 9; p++) {
        size_t next = 0;
        bool ok = true;
        for (int r = 0; r < p; r++) {
            ok = ok && comm_block_offset(n, p, r) == next && comm_block_count(n, p, r) * p <= n + p - 1 &&
                 comm_block_count(n, p, r) * p + p >= n + 1;
            next += comm_block_count(n, p, r);
        }
        record(g, ok && next == n, "split of %zu over %d ranks", n, p);
    }
    Comm half = comm_split(&W, W.rank % 2, W.rank, "half");
    record(g, half.size == (W.size + 1 - W.rank % 2) / 2 && half.rank == W.rank / 2, "comm_split: size %d rank %d", half.size, half.rank);
    // an all-reduce on the sub-group: sum of world ranks of the same parity
    int mine = W.rank, sum = 0, want = 0;
    allreduce_ring(&half, &mine, &sum, 1, COMM_INT32, COMM_SUM);
    for (int q = W.rank % 2; q < W.size; q += 2) { want += q; }
    record(g, sum == want, "allreduce_ring on a sub-group: got %d, want %d", sum, want);
    record(g, W.size == 1 || half.bytes_sent > 0 || half.size == 1, "sub-group counters did not count");
    comm_free(&half);
    report(g);
}

static void bad_call(const char* what) {
    int v = 1, out = 0;
    if (strcmp(what, "root") == 0) {
        broadcast_tree(&W, &v, 1, COMM_INT32, W.size);
    } else if (strcmp(what, "count") == 0) {
        int buf[4] = {0, 0, 0, 0}, res[4];
        allreduce_ring(&W, buf, res, W.rank == 0 ? 3 : 4, COMM_INT32, COMM_SUM);
    } else if (strcmp(what, "servers") == 0) {
        allreduce_parameter_server(&W, &v, &out, 1, COMM_INT32, COMM_SUM, W.size + 1);
    } else if (strcmp(what, "node") == 0) {
        allreduce_hierarchical(&W, &v, &out, 1, COMM_INT32, COMM_SUM, W.size + 1, HIER_INTER_RING);
    } else if (strcmp(what, "leader node") == 0) {
        allreduce_hierarchical_leader(&W, &v, &out, 1, COMM_INT32, COMM_SUM, W.size + 1, HIER_INTER_RING);
    } else if (strcmp(what, "grid") == 0) {
        allreduce_torus2d(&W, &v, &out, 1, COMM_INT32, COMM_SUM, 2, W.size);
    } else if (strcmp(what, "alltoallv") == 0) {
        // rank 0 sends 2 elements to every rank; rank 1 expects 3 from rank 0
        int sbuf[8] = {0}, rbuf[8];
        size_t sc[2] = {2, 2}, sd[2] = {0, 2}, rc[2] = {W.rank == 1 ? 3u : 2u, 2}, rd[2] = {0, 3};
        alltoallv_pairwise(&W, sbuf, sc, sd, rbuf, rc, rd, COMM_INT32);
    } else {
        die("unknown --bad '%s' (root, count, servers, node, leader node, grid, alltoallv)", what);
    }
    printf("bad call '%s' returned (%d)\n", what, out);
}

// auto (llmc/comm/auto.h). Without a tuning file the formulas choose (the default links); with
// one, its measured winner per size. The file written here makes every candidate the winner of
// some of the sizes the groups below use (bytes = count x 2 or 4), so each runs bit-exact against
// MPI with its bytes and messages equal to the chosen algorithm's formula.
static void test_auto() {
    int p = W.size, node = 0;
    for (int d = 2; d < p; d++) { if (p % d == 0) { node = d; break; } }   // a divisor for hierarchical (none: p prime or < 4)
    Group g;
    g.name = "auto: its choice";
    // no file: the formulas with the default links (recursive doubling's alpha log p for small
    // buffers; for large ones Rabenseifner, whose bytes equal the ring's in fewer steps, when p
    // is a power of two above 2: on 2 ranks recursive doubling is one exchange of S, the least)
    int nd;
    const TuneRow* row;
    std::string small = auto_choose(AUTO_ALLREDUCE, p, 8, &nd, &row), large = auto_choose(AUTO_ALLREDUCE, p, 64 << 20, &nd, &row);
    CommLinks L = auto_links(g_auto_tuning, p);
    bool formula_ok = p < 2 || (small == auto_predict(AUTO_ALLREDUCE, L, 8, p) && large == auto_predict(AUTO_ALLREDUCE, L, 64 << 20, p) &&
                                small == "recursive_doubling" && (large == "rabenseifner" || !ab_pow2(p) || p == 2) && row == NULL);
    record(g, formula_ok, "no file, p=%d: 8 B -> %s, 64 MiB -> %s (want recursive_doubling, rabenseifner)", p, small.c_str(), large.c_str());
    // the file
    char path[256];
    snprintf(path, sizeof(path), "build/test-collectives-tuning-%d.txt", p);
    if (W.rank == 0) {
        FILE* f = fopen(path, "w");
        fprintf(f, "# test_collectives: every candidate wins somewhere\nlink intra 1.0 5.0\n");
        fprintf(f, "allreduce %d %d 0 15 - ring\nallreduce %d %d 16 2047 - recursive_doubling\n", p, p, p, p);
        fprintf(f, "allreduce %d %d 2048 16383 - rabenseifner\n", p, p);
        if (node) { fprintf(f, "allreduce %d %d 16384 99999999 - hierarchical\n", p, node); }
        fprintf(f, "reduce_scatter %d %d 0 2047 - ring\nreduce_scatter %d %d 2048 99999999 - recursive_halving\n", p, p, p, p);
        fprintf(f, "allgather %d %d 0 63 - ring\nallgather %d %d 64 2047 - recursive_doubling\n", p, p, p, p);
        fprintf(f, "allgather %d %d 2048 99999999 - bruck\n", p, p);
        fprintf(f, "broadcast %d %d 0 2047 - tree\nbroadcast %d %d 2048 99999999 - ring\n", p, p, p, p);
        fclose(f);
    }
    MPI_Barrier(W.mpi);
    comm_tuning_load(&W, path);
    struct { int prim; size_t bytes; const char* want; } picks[] = {
        {AUTO_ALLREDUCE, 8, "ring"}, {AUTO_ALLREDUCE, 100, "recursive_doubling"}, {AUTO_ALLREDUCE, 4036, "rabenseifner"},
        {AUTO_ALLREDUCE, 800012, node ? "hierarchical" : "rabenseifner"}, {AUTO_REDUCE_SCATTER, 4, "ring"},
        {AUTO_REDUCE_SCATTER, 4036, "recursive_halving"}, {AUTO_ALLGATHER, 40, "ring"}, {AUTO_ALLGATHER, 1000, "recursive_doubling"},
        {AUTO_ALLGATHER, 4036, "bruck"}, {AUTO_BROADCAST, 4, "tree"}, {AUTO_BROADCAST, 4036, "ring"},
    };
    for (auto& k : picks) {
        std::string a = auto_choose(k.prim, p, k.bytes, &nd, &row);
        record(g, a == k.want, "file, p=%d: %s of %zu bytes -> %s, want %s", p, AUTO_PRIM_NAMES[k.prim], k.bytes, a.c_str(), k.want);
    }
    // a size in no row: the row nearer in log scale (a file with rows 16..64 and 4096..8192)
    CommTuning saved = g_auto_tuning, gap;
    std::string err;
    bool parsed = tuning_parse("allreduce 3 3 16 64 - ring\nallreduce 3 3 4096 8192 - recursive_doubling\n", &gap, &err);
    g_auto_tuning = gap;
    auto pick3 = [&](size_t b) { return std::string(auto_choose(AUTO_ALLREDUCE, 3, b, &nd, &row)); };
    record(g, parsed && pick3(4) == "ring" && pick3(500) == "ring" && pick3(600) == "recursive_doubling" &&
           pick3((size_t)1 << 30) == "recursive_doubling", "between and outside the rows: %s", err.c_str());
    g_auto_tuning = saved;
    // a bad file says which line
    CommTuning bad;
    bool refused = !tuning_parse("link intra 1 5\nallreduce 4 4 0 10 ring tree\n", &bad, &err) && err.find("line 2") == 0;
    record(g, refused, "a row with an algorithm auto does not have (tree for allreduce): refused with its line, got '%s'", err.c_str());
    report(g);
    test_allreduce("auto (a tuning file: every candidate)", allreduce_auto, allreduce_auto_volume, false);
    test_reduce_scatter("auto (a tuning file: every candidate)", reduce_scatter_auto, reduce_scatter_auto_volume);
    test_allgather("auto (a tuning file: every candidate)", allgather_auto, allgather_auto_volume);
    test_broadcast("auto (a tuning file: every candidate)", broadcast_auto, broadcast_auto_volume);
    for (AutoHierPlan& h : g_auto_hier) { hier_plan_free(&h.plan); }
    g_auto_hier.clear();
    g_auto_tuning = CommTuning();
    MPI_Barrier(W.mpi);
    if (W.rank == 0) { remove(path); }
}

int main(int argc, char** argv) {
    W = comm_init_world(&argc, &argv);
    if (argc == 3 && strcmp(argv[1], "--bad") == 0) {
        bad_call(argv[2]);
        comm_finalize();
        return 0;
    }
    double t0 = wall_seconds();
    last_report = t0;
    test_counts_and_split();
    test_allreduce("native", allreduce_native, no_volume);
    test_allreduce("ring", allreduce_ring, allreduce_ring_volume);
    test_allreduce("recursive_doubling", allreduce_recursive_doubling, allreduce_recursive_doubling_volume);
    test_allreduce("rabenseifner", allreduce_rabenseifner, allreduce_rabenseifner_volume);
    test_reduce_scatter("native", reduce_scatter_native, no_volume);
    test_reduce_scatter("ring", reduce_scatter_ring, reduce_scatter_ring_volume);
    test_reduce_scatter("recursive_halving", reduce_scatter_recursive_halving, reduce_scatter_recursive_halving_volume);
    test_allgather("native", allgather_native, no_volume);
    test_allgather("ring", allgather_ring, allgather_ring_volume);
    test_allgather("recursive_doubling", allgather_recursive_doubling, allgather_recursive_doubling_volume);
    test_allgather("bruck", allgather_bruck, allgather_bruck_volume);
    test_broadcast("native", broadcast_native, no_root_volume);
    test_broadcast("ring", broadcast_ring, broadcast_ring_default_volume);
    test_broadcast("ring chunk=7", broadcast_ring_small_chunks, broadcast_ring_small_volume);
    test_broadcast("tree", broadcast_tree, broadcast_tree_volume);
    test_reduce("native", reduce_native_fn, no_root_volume);
    test_reduce("tree", reduce_tree, reduce_tree_volume);
    test_gather_scatter();
    test_alltoall();
    test_alltoall_algo("pairwise", alltoall_pairwise, alltoall_pairwise_volume);
    test_alltoall_algo("bruck", alltoall_bruck, alltoall_bruck_volume);
    test_alltoallv_pairwise();
    test_parameter_server_formulas();
    test_new_allreduces();
    test_auto();
    barrier_native(&W);
    if (W.rank == 0) { printf("p=%d: %.1f s, %d failing groups\n", W.size, wall_seconds() - t0, total_failed_groups); }
    comm_free(&W);
    comm_finalize();
    return total_failed_groups > 0 ? 1 : 0;
}
#endif
