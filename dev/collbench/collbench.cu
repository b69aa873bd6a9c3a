// collbench: times every collective algorithm of llmc/comm/ against the native one, in the
// style of NVIDIA's nccl-tests, and prints the alpha-beta model's prediction beside each time.
// A .cu file like train_gpt2.cu: built for the CPU with mpicxx (host buffers over MPI), or by
// nvcc for device buffers (see "Device buffers" below). The CPU build:
//   mpicxx -x c++ -DLLMC_CPU -DUSE_MPI collbench.cu -o collbenchcpu      (make collbenchcpu)
//   mpirun -np 4 ./collbenchcpu -p allreduce -a all -b 8 -e 64M -f 4
//
// What one run does:
//   1. a ping-pong between ranks 0 and 1 measures alpha (seconds per message) and beta
//      (seconds per byte) of the transport, and prints them; when the ranks span several
//      nodes (see "Nodes and links" below), a second ping-pong between rank 0 and the first
//      rank of node 1 measures the link between nodes, and an exchange between the same two
//      ranks (both directions at once) its time per byte when a pair exchanges (beta_x);
//   2. for every size from -b to -e (times -f) and every algorithm of the primitive (-a): one
//      checked run against the native result (#wrong), -w warm-up runs, then -n timed runs;
//      one line per (size, algorithm) with nccl-tests' columns plus the model's time;
//   3. a summary: the fastest algorithm per band of sizes (the crossover), and each
//      algorithm's bus bandwidth as a fraction of the native one's.
//
// Conventions (nccl-tests'): size is the bytes of the full buffer S (all-reduce, broadcast,
// reduce: the buffer; reduce-scatter, all-gather, gather, scatter: the unreduced or gathered
// buffer; all-to-all: the p blocks a rank sends). count = S / sizeof(type). time is the mean
// over the -n runs of the slowest rank, in the fastest of -R rounds (the algorithms' rounds
// taken in turn). algbw = S / time, busbw = algbw * factor, the factor making busbw comparable
// with the wire's bandwidth: all-reduce 2(p-1)/p, reduce-scatter, all-gather, gather, scatter
// and all-to-all (p-1)/p, broadcast and reduce 1.
// #wrong counts the elements, summed over ranks, that differ bit for bit from the native
// collective's result on integer-valued data (exact in every type and op).
//
// Device buffers (the CUDA build: nvcc without -DLLMC_CPU, `make collbenchcu`), as nccl-tests
// measures GPU buffers: each rank takes a GPU (comm_select_device, round robin over its node's
// GPUs), the world communicator becomes a device communicator (comm_enable_device) whose wire
// is NCCL, or host-staged MPI through pinned copies when ranks share a GPU or with -S 1 (or
// LLMC_COMM_STAGED=1). send, recv and the reference are cudaMalloc'd, filled by copying the same
// integer-valued host data in, and every algorithm, native (nccl*) and educational, runs on
// them. #wrong copies each result back to the host and compares it with the native result's
// host copy. Timing is wall time (MPI_Wtime) taken after cudaDeviceSynchronize, not CUDA events:
// the educational algorithms are driven step by step from the host (staging copies, a stream
// synchronisation per message), so only the host's clock sees all of their time; every call
// of llmc/comm/ returns with its data in place anyway, the synchronisation is a safeguard.
// The ping-pong runs on device buffers over the same wire, gamma is the device reduce kernel.
//   nvcc -std=c++17 -O3 -DUSE_MPI -DOMPI_SKIP_MPICXX $(mpicxx --showme:compile)
//        collbench.cu -o collbenchcu $(mpicxx --showme:link) -lnccl     (make collbenchcu)
//   mpirun -np 4 ./collbenchcu -p allreduce -a all -b 8 -e 256M -f 4 [-S 1]
//
// Nodes and links. MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) tells which ranks share a node
// (for Open MPI: a host; each network namespace of an emulated cluster is one). When the ranks
// span several nodes of equal size n with consecutive ranks (node k = ranks [k n, (k+1) n)),
// collbench prints "# nodes: m x n ranks (names)", measures two links, inside a node (rank
// 0 <-> 1, when n >= 2: alpha, beta) and between nodes (rank 0 <-> n: alpha', beta'), makes
// n the default of -N, and the model of each algorithm puts each step on the link it uses:
//   flat ring all-reduce:  every step has one pair crossing into the next node, so every step
//                          runs at the slow link's pace: 2 (p-1) (alpha' + S/p beta');
//   hierarchical:          steps 1 and 3 inside, step 2 between nodes, where the n ranks of a
//                          node cross at once and share the node's one network link (n beta');
//   hierarchical_leader:   tree reduce and broadcast inside, the leaders' ring between nodes
//                          (one flow per node);
//   recursive doubling/halving, Rabenseifner: the butterfly steps whose partners sit on
//                          different nodes (distance >= n) cross, all ranks of a node at once;
//   the others (tree, parameter server, Bruck, pairwise): the slow link for every step.
// Exchanges: a step in which two ranks on different nodes send to each other at once (a
// sendrecv with the same peer both ways) is priced with beta_x, not beta': rank 0 and n exchange
// 16 MiB. Over Open MPI's TCP transport such a pair gets about half the one-way rate each way,
// though the link is full duplex (two raw TCP sockets exchange at nearly the one-way rate; so
// does the pair with --mca btl_tcp_links 2, two connections per pair) and a flat ring's
// crossings (one process per direction) are not slowed. On 2 x 2 the probe read beta' in about
// half the runs while the algorithms' exchanges stayed slow (doc/collectives.md). Which steps:
// ab_inter_x.
// One link per node is the assumption (our namespaces' veth, one NIC); a node with one NIC per
// GPU would give each flow its own link. One node, or an irregular layout (nodes of unequal
// size, ranks not in consecutive blocks: said on a "# nodes:" line): one link, rank 0 <-> 1,
// for every step, the sqrt rule for -N, and the output of a one-node run has no "# nodes:" line.
// -L FILE writes the measured links for the planner (train_gpt2cpu --plan all --links FILE).
//
// Adding an algorithm = one row of ALGOS below: primitive, name, a call (one of the ALGO_*
// macros adapts the algorithm's signature), and its alpha-beta model (a ModelFn, or NULL).
#include "../../llmc/common.h"

#ifndef USE_MPI
int main() {
    fprintf(stderr, "error: collbench needs MPI: build it with mpicxx and -DUSE_MPI (make collbenchcpu)\n");
    return 1;
}
#else
#include <string>
#include <vector>
#include "../../llmc/comm/native.h"
#include "../../llmc/comm/ring.h"
#include "../../llmc/comm/tree.h"
#include "../../llmc/comm/recursive.h"
#include "../../llmc/comm/alltoall.h"
#include "../../llmc/comm/bruck.h"
#include "../../llmc/comm/ps.h"
#include "../../llmc/comm/hierarchical.h"
#include "../../llmc/comm/torus.h"
#include "../../llmc/comm/alpha_beta.h"
#include "../../llmc/comm/auto.h"
#include "../../llmc/paths.h"

#ifdef LLMC_CUDA_COMM
#define COLLBENCH_DEVICE 1          // device buffers (see "Device buffers" above)
#define COLLBENCH_PROG "collbenchcu"
#define COLLBENCH_FLAGS "befnwcdorpasNRLTS"
#else
#define COLLBENCH_PROG "collbenchcpu"
#define COLLBENCH_FLAGS "befnwcdorpasNRLT"
#endif

// --- the benchmarked buffers: host memory (CPU build) or device memory (CUDA build)

static void* bench_alloc(const Comm* c, size_t n, CommType t) {
#ifdef COLLBENCH_DEVICE
    void* p = NULL;
    comm_cuda_check(c, "cudaMalloc", cudaMalloc(&p, (n == 0 ? 1 : n) * comm_type_size(t)));
    return p;
#else
    (void)c;
    return comm_scratch(n, t);
#endif
}
static void bench_free(void* p) {
#ifdef COLLBENCH_DEVICE
    cudaFree(p);
#else
    free(p);
#endif
}
static void bench_memset(const Comm* c, void* p, int v, size_t bytes) {
#ifdef COLLBENCH_DEVICE
    comm_cuda_check(c, "cudaMemset", cudaMemset(p, v, bytes));
#else
    (void)c;
    memset(p, v, bytes);
#endif
}
// host data into a benchmarked buffer
static void bench_upload(const Comm* c, void* dst, const void* host, size_t bytes) {
#ifdef COLLBENCH_DEVICE
    comm_cuda_check(c, "cudaMemcpy", cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
#else
    (void)c;
    if (dst != host) { memcpy(dst, host, bytes); }
#endif
}
// a host view of the first `bytes` of a benchmarked buffer: the buffer itself (host), or its
// copy in `host` (device)
static const void* bench_view(const Comm* c, const void* buf, void* host, size_t bytes) {
#ifdef COLLBENCH_DEVICE
    if (bytes > 0) { comm_cuda_check(c, "cudaMemcpy", cudaMemcpy(host, buf, bytes, cudaMemcpyDeviceToHost)); }
    return host;
#else
    (void)c;
    (void)host;
    (void)bytes;
    return buf;
#endif
}
// all this rank's device work done (before the clock is read)
static void bench_sync(const Comm* c) {
#ifdef COLLBENCH_DEVICE
    comm_cuda_check(c, "cudaDeviceSynchronize", cudaDeviceSynchronize());
#else
    (void)c;
#endif
}

// --- the primitives

typedef enum { P_ALLREDUCE, P_REDUCE_SCATTER, P_ALLGATHER, P_BROADCAST, P_REDUCE, P_GATHER, P_SCATTER, P_ALLTOALL, P_COUNT } Prim;
static const char* PRIM_NAMES[P_COUNT] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                          "reduce", "gather", "scatter", "alltoall"};

// nccl-tests' bus-bandwidth factor
static double busbw_factor(Prim pr, int p) {
    switch (pr) {
        case P_ALLREDUCE: return 2.0 * (p - 1) / p;
        case P_BROADCAST: case P_REDUCE: return 1.0;
        default: return (double)(p - 1) / p;
    }
}

// One uniform call for every primitive: count is the full buffer's elements (all-to-all: per
// pair of ranks). Each wrapper ignores the arguments its primitive does not take.
typedef void (*RunFn)(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op, int root);

typedef double (*ModelFn)(const CommLinks& L, double S, int p);

struct Algo {
    Prim prim;
    const char* name;
    RunFn run;
    ModelFn model;      // NULL: no model (native: MPI picks its own algorithm inside)
};

// Algorithms with a parameter of their own: the servers of ps.h (-s), the node size of
// hierarchical.h (-N) and the grid of torus.h (rows x cols, rows the largest divisor of p
// that is <= sqrt p). Set in main before the sweep.
static int g_servers = 1, g_node = 1, g_rows = 1, g_cols = 1;
static int default_node_size(int p) {                   // the largest divisor of p <= sqrt(p)
    int n = 1;
    for (int d = 1; d * d <= p; d++) { if (p % d == 0) { n = d; } }
    return n;
}
// ps.h: the servers' links carry (p-1) S/s each way (the slow link)
static double m_ps(const CommLinks& L, double S, int p) { return 2 * (p - 1) * ab_inter(L, S / g_servers, 1); }
// hierarchical.h (both variants), torus.h: the models of alpha_beta.h with -N's node size (torus: a row)
static double m_hier(const CommLinks& L, double S, int p) { return ab_hier(L, S, p, g_node); }
static double m_leader(const CommLinks& L, double S, int p) { return ab_leader(L, S, p, g_node); }
static double m_torus(const CommLinks& L, double S, int p) { return ab_hier(L, S, p, g_cols); }

// auto.h: the model of the algorithm auto takes at this size (its tuning file's, -T, or the
// formulas' choice)
static double m_auto(int prim, const CommLinks& L, double S, int p) {
    int node;
    std::string a = auto_choose(prim, p, (size_t)S, &node, NULL);
    return auto_model(prim, a, L, S, p, node);
}
static double m_auto_ar(const CommLinks& L, double S, int p) { return m_auto(AUTO_ALLREDUCE, L, S, p); }
static double m_auto_rs(const CommLinks& L, double S, int p) { return m_auto(AUTO_REDUCE_SCATTER, L, S, p); }
static double m_auto_ag(const CommLinks& L, double S, int p) { return m_auto(AUTO_ALLGATHER, L, S, p); }
static double m_auto_bc(const CommLinks& L, double S, int p) { return m_auto(AUTO_BROADCAST, L, S, p); }

// The sub-communicators of hierarchical (both variants) and torus are made once (a HierPlan)
// and reused, so that collbench times the algorithm, not two MPI_Comm_split per call.
static HierPlan g_hier_plan, g_torus_plan;
static bool g_have_hier = false, g_have_torus = false;
static HierPlan* hier_plan_bench(Comm* c) {
    if (!g_have_hier) { g_hier_plan = hier_plan_make(c, "allreduce_hierarchical", g_node); g_have_hier = true; }
    return &g_hier_plan;
}
static void allreduce_hier_bench(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    allreduce_hierarchical_plan(c, hier_plan_bench(c), s, r, n, t, op, HIER_INTER_RING);
}
static void allreduce_leader_bench(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    allreduce_hierarchical_leader_plan(c, hier_plan_bench(c), s, r, n, t, op, HIER_INTER_RING);
}
static void allreduce_torus_bench(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    if (!g_have_torus) {
        torus2d_check_grid(c, "allreduce_torus2d", g_rows, g_cols);
        g_torus_plan = hier_plan_make(c, "allreduce_torus2d", g_cols);   // a row is a "node"
        g_have_torus = true;
    }
    allreduce_hierarchical_plan(c, &g_torus_plan, s, r, n, t, op, HIER_INTER_RING);
}
static void allreduce_ps_bench(Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) {
    allreduce_parameter_server(c, s, r, n, t, op, g_servers);
}

// --- the table: one row per (primitive, algorithm)

#define ALGO_REDUCE(prim, name, fn, model) \
    {prim, name, [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op, int) { fn(c, s, r, n, t, op); }, model}
#define ALGO_GATHER(prim, name, fn, model) \
    {prim, name, [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp, int) { fn(c, s, r, n, t); }, model}
#define ALGO_ROOTED(prim, name, fn, model) \
    {prim, name, [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op, int root) { fn(c, s, r, n, t, op, root); }, model}
#define ALGO_ROOTED_MOVE(prim, name, fn, model) \
    {prim, name, [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp, int root) { fn(c, s, r, n, t, root); }, model}
// broadcast is in place on one buffer: collbench passes the root's data in send and the result in recv
#define ALGO_BCAST(name, fn, model) \
    {P_BROADCAST, name, [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp, int root) { \
        if (c->rank == root) { comm_copy(r, s, n, t); } fn(c, r, n, t, root); }, model}

static const Algo ALGOS[] = {
    ALGO_REDUCE(P_ALLREDUCE, "native", allreduce_native, NULL),
    ALGO_REDUCE(P_ALLREDUCE, "ring", allreduce_ring, ab_ring_ar),
    ALGO_REDUCE(P_ALLREDUCE, "recursive_doubling", allreduce_recursive_doubling, ab_rd_ar),
    ALGO_REDUCE(P_ALLREDUCE, "rabenseifner", allreduce_rabenseifner, ab_raben),
    ALGO_REDUCE(P_ALLREDUCE, "parameter_server", allreduce_ps_bench, m_ps),
    ALGO_REDUCE(P_ALLREDUCE, "hierarchical", allreduce_hier_bench, m_hier),
    ALGO_REDUCE(P_ALLREDUCE, "hierarchical_leader", allreduce_leader_bench, m_leader),
    ALGO_REDUCE(P_ALLREDUCE, "torus2d", allreduce_torus_bench, m_torus),
    ALGO_REDUCE(P_ALLREDUCE, "auto", allreduce_auto, m_auto_ar),

    ALGO_REDUCE(P_REDUCE_SCATTER, "native", reduce_scatter_native, NULL),
    ALGO_REDUCE(P_REDUCE_SCATTER, "ring", reduce_scatter_ring, ab_ring_rs),
    ALGO_REDUCE(P_REDUCE_SCATTER, "recursive_halving", reduce_scatter_recursive_halving, ab_rh_rs),
    ALGO_REDUCE(P_REDUCE_SCATTER, "auto", reduce_scatter_auto, m_auto_rs),

    ALGO_GATHER(P_ALLGATHER, "native", allgather_native, NULL),
    ALGO_GATHER(P_ALLGATHER, "ring", allgather_ring, ab_ring_rs),
    ALGO_GATHER(P_ALLGATHER, "recursive_doubling", allgather_recursive_doubling, ab_rh_rs),
    ALGO_GATHER(P_ALLGATHER, "bruck", allgather_bruck, ab_bruck_ag),
    ALGO_GATHER(P_ALLGATHER, "auto", allgather_auto, m_auto_ag),

    ALGO_BCAST("native", broadcast_native, NULL),
    ALGO_BCAST("ring", broadcast_ring, ab_ring_bcast),
    ALGO_BCAST("tree", broadcast_tree, ab_tree),
    ALGO_BCAST("auto", broadcast_auto, m_auto_bc),

    ALGO_ROOTED(P_REDUCE, "native", reduce_native, NULL),
    ALGO_ROOTED(P_REDUCE, "tree", reduce_tree, ab_tree),

    ALGO_ROOTED_MOVE(P_GATHER, "native", gather_native, NULL),
    ALGO_ROOTED_MOVE(P_SCATTER, "native", scatter_native, NULL),

    ALGO_GATHER(P_ALLTOALL, "native", alltoall_native, NULL),
    ALGO_GATHER(P_ALLTOALL, "pairwise", alltoall_pairwise, ab_pairwise),
    ALGO_GATHER(P_ALLTOALL, "bruck", alltoall_bruck, ab_bruck_a2a),
};
static const int N_ALGOS = (int)(sizeof(ALGOS) / sizeof(ALGOS[0]));

// --- flags

struct Opts {
    size_t minbytes = 8, maxbytes = 64u << 20;
    double factor = 2;
    int iters = 20, warmup = 5, check = 1, root = 0, rounds = 3;
    CommType type = COMM_FP32;
    CommOp op = COMM_SUM;
    Prim prim = P_ALLREDUCE;
    std::string algos = "all";
    int servers = 1;     // -s: parameter_server
    int node = 0;        // -N: hierarchical; 0 = the node size (ranks span nodes), else the largest divisor of p <= sqrt(p)
    const char* links = NULL;   // -L: write the links file the planner reads
    int staged = 0;      // -S: device build: host-staged wire even where NCCL could run
    const char* tuning = NULL;  // -T: the tuning file auto reads
    int tune = 0;               // --autotune: measure and write -T's tuning file (collbench_tune.h)
};

// The flags that name a path, each with its role (llmc/paths.h): the checks before any work follow
// from it (parse_opts: paths_check), and -h prints it (test/test_flag_roles.sh reads that)
struct CollbenchPath { char flag; PathRole role; const char* help; };
static const CollbenchPath COLLBENCH_PATHS[] = {
    {'L', PATH_OUT_FILE, "write the measured links to this file for the planner (train_gpt2cpu --plan all\n"
                         "             --links FILE): 'intra ALPHA_US GB_PER_S', and 'inter ...' when the ranks span nodes"},
    {'T', PATH_IN_FILE, "the tuning file the auto algorithm reads (default: none, the formulas choose); with\n"
                        "             --autotune read (its rows of other rank counts kept) and rewritten (FILE_RW)"},
};

static void usage(void) {
    printf("usage: mpirun -np P ./" COLLBENCH_PROG " [flags]\n"
           "  -b BYTES   smallest size (suffix K, M, G allowed; default 8)\n"
           "  -e BYTES   largest size (default 64M)\n"
           "  -f F       multiply the size by F each step (default 2)\n"
           "  -n N       timed iterations per size (default 20); 0: per size and algorithm, as many as\n"
           "             make a round of about 20 ms (2 to 10000): latency-bound sizes get thousands\n"
           "  -w N       warm-up iterations per size (default 5)\n"
           "  -R N       rounds of -n timed iterations, the algorithms' rounds in turn; the fastest is reported (default 3)\n"
           "  -c 0|1     check every result against the native collective (default 1)\n"
           "  -d TYPE    float, bf16 or int32 (default float)\n"
           "  -o OP      sum, avg, max or min (default sum)\n"
           "  -r ROOT    root of broadcast, reduce, gather, scatter (default 0)\n"
           "  -p PRIM    allreduce, reduce_scatter, allgather, broadcast, reduce, gather, scatter, alltoall\n"
           "  -a ALGOS   comma-separated algorithm names, or all (default): every one that implements PRIM\n"
           "  -s N       parameter_server: number of servers (default 1)\n"
           "  -N N       hierarchical, hierarchical_leader: ranks per node (default: the ranks per node\n"
           "             when they span several nodes of equal size, else the largest divisor of p\n"
           "             <= sqrt p); torus2d uses a rows x cols grid with rows = that divisor\n"
           );
    for (const CollbenchPath& x : COLLBENCH_PATHS) { printf("  -%c %-7s %s\n", x.flag, path_role_word(x.role), x.help); }
    printf("  --autotune\n"
           "             measure which of our algorithms is fastest per size for allreduce, reduce_scatter,\n"
           "             allgather and broadcast (-b, -e, -f, -n, -R, -w apply), beside the formulas' choice,\n"
           "             and write it to -T FILE for auto (its rows of other rank counts are kept). Not named\n"
           "             --tune: mpirun takes '--tune FILE' anywhere on its line as a parameter file of its own\n"
#ifdef COLLBENCH_DEVICE
           "  -S 0|1     device buffers over the host-staged wire (pinned copies + MPI) instead of NCCL;\n"
           "             chosen anyway when ranks share a GPU (default 0)\n"
#endif
           "algorithms:");
    for (int i = 0; i < N_ALGOS; i++) { printf("%s %s/%s", i % 4 == 0 ? "\n   " : "", PRIM_NAMES[ALGOS[i].prim], ALGOS[i].name); }
    printf("\n");
}

// A byte count: digits (and a fraction), then K, M or G; 1 byte to 1 TiB (nan, inf, 1e400 and 0 refused:
// 0 would never grow by -f)
static size_t parse_bytes(const char* flag, const char* s) {
    char* end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || !(v >= 0) || !isfinite(v) || !isdigit((unsigned char)s[0])) {
        die("collbench: %s wants a byte count such as 8, 4K or 64M, got '%s'", flag, s);
    }
    double mult = 1;
    if (*end == 'K' || *end == 'k') { mult = 1024.0; end++; }
    else if (*end == 'M' || *end == 'm') { mult = 1024.0 * 1024; end++; }
    else if (*end == 'G' || *end == 'g') { mult = 1024.0 * 1024 * 1024; end++; }
    if (*end != '\0') { die("collbench: %s wants a byte count such as 8, 4K or 64M, got '%s'", flag, s); }
    if (!(v * mult >= 1.0) || v * mult > 1099511627776.0) { die("collbench: %s %s is not within 1 byte to 1T (one buffer of the benchmark)", flag, s); }
    return (size_t)(v * mult);
}

static long parse_int(const char* flag, const char* s, long lo, long hi) {
    char* end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) {
        die("collbench: %s wants an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    }
    return v;
}

static const int COLLBENCH_MAX_SIZES = 1000;

// Every rank parses the same argv, so a bad flag makes every rank die() with status 1.
static Opts parse_opts(int argc, char** argv) {
    Opts o;
    die_set_rank_from_launcher();   // errors name the rank: "error: [rank R] collbench: ..."
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) { usage(); exit(0); }
        if (strcmp(f, "--autotune") == 0) { o.tune = 1; continue; }   // writes -T's file (see usage)
        if (f[0] != '-' || f[1] == '\0' || f[2] != '\0' || strchr(COLLBENCH_FLAGS, f[1]) == NULL) {
            die("collbench: unknown flag '%s' (see -h)", f);
        }
        if (i + 1 >= argc) { die("collbench: %s needs a value (see -h)", f); }
        const char* v = argv[++i];
        switch (f[1]) {
            case 'b': o.minbytes = parse_bytes(f, v); break;
            case 'e': o.maxbytes = parse_bytes(f, v); break;
            case 'f': {
                char* end = NULL;
                o.factor = strtod(v, &end);
                if (end == v || *end != '\0' || !(o.factor > 1.0) || !isfinite(o.factor) || !isdigit((unsigned char)v[0])) {
                    die("collbench: -f wants a factor > 1, got '%s'", v);
                }
                break;
            }
            case 'n': o.iters = (int)parse_int(f, v, 0, 1000000); break;
            case 'w': o.warmup = (int)parse_int(f, v, 0, 1000000); break;
            case 'c': o.check = (int)parse_int(f, v, 0, 1); break;
            case 'r': o.root = (int)parse_int(f, v, 0, 1 << 30); break;
            case 'd':
                if (strcmp(v, "float") == 0 || strcmp(v, "fp32") == 0) { o.type = COMM_FP32; }
                else if (strcmp(v, "bf16") == 0 || strcmp(v, "bfloat16") == 0) { o.type = COMM_BF16; }
                else if (strcmp(v, "int32") == 0 || strcmp(v, "int") == 0) { o.type = COMM_INT32; }
                else { die("collbench: -d wants float, bf16 or int32, got '%s'", v); }
                break;
            case 'o':
                if (strcmp(v, "sum") == 0) { o.op = COMM_SUM; }
                else if (strcmp(v, "avg") == 0) { o.op = COMM_AVG; }
                else if (strcmp(v, "max") == 0) { o.op = COMM_MAX; }
                else if (strcmp(v, "min") == 0) { o.op = COMM_MIN; }
                else { die("collbench: -o wants sum, avg, max or min, got '%s'", v); }
                break;
            case 'p': {
                int k = 0;
                while (k < P_COUNT && strcmp(v, PRIM_NAMES[k]) != 0) { k++; }
                if (k == P_COUNT) { die("collbench: -p: unknown primitive '%s' (see -h)", v); }
                o.prim = (Prim)k;
                break;
            }
            case 'a': o.algos = v; break;
            case 's': o.servers = (int)parse_int(f, v, 1, 1 << 30); break;
            case 'R': o.rounds = (int)parse_int(f, v, 1, 1000000); break;
            case 'N': o.node = (int)parse_int(f, v, 1, 1 << 30); break;
            case 'S': o.staged = (int)parse_int(f, v, 0, 1); break;
            case 'L':
                if (*v == '\0') { die("collbench: -L wants a file name"); }
                o.links = v;
                break;
            case 'T':
                if (*v == '\0') { die("collbench: -T wants a file name"); }
                o.tuning = v;
                break;
        }
    }
    if (o.minbytes > o.maxbytes) { die("collbench: -b %zu is larger than -e %zu", o.minbytes, o.maxbytes); }
    if (o.tune && !o.tuning) { die("collbench: --autotune writes the tuning file -T FILE names: add -T FILE"); }
    // the sizes -b, -e and -f make: a bounded table (-f 1.0000001 would make millions)
    double sizes = floor(log((double)o.maxbytes / (double)o.minbytes) / log(o.factor) + 1e-9) + 1;
    if (sizes > COLLBENCH_MAX_SIZES) {
        die("collbench: -b %zu -e %zu -f %.9g make %.0f sizes, more than %d: raise -f or narrow -b..-e", o.minbytes, o.maxbytes,
            o.factor, sizes, COLLBENCH_MAX_SIZES);
    }
    // every path by its role (COLLBENCH_PATHS), before any work: rank 0 writes the files
    std::vector<PathFlag> paths;
    for (const CollbenchPath& x : COLLBENCH_PATHS) {
        const char* v = x.flag == 'L' ? o.links : o.tuning;
        paths.push_back({x.flag == 'L' ? "collbench: -L" : "collbench: -T", x.flag == 'T' && o.tune ? PATH_UPDATE_FILE : x.role, v});
    }
    paths_check(paths, *die_rank_slot() <= 0);
    return o;
}

// the rows of ALGOS that -p and -a select, native first (the reference)
static std::vector<const Algo*> select_algos(const Opts& o) {
    std::vector<const Algo*> out;
    std::vector<std::string> names;
    if (o.algos != "all") {
        size_t start = 0;
        while (start <= o.algos.size()) {
            size_t comma = o.algos.find(',', start);
            if (comma == std::string::npos) { comma = o.algos.size(); }
            names.push_back(o.algos.substr(start, comma - start));
            start = comma + 1;
        }
    }
    for (const std::string& n : names) {
        bool found = false;
        for (int i = 0; i < N_ALGOS; i++) { found |= ALGOS[i].prim == o.prim && n == ALGOS[i].name; }
        if (!found) {
            std::string have;
            for (int i = 0; i < N_ALGOS; i++) {
                if (ALGOS[i].prim == o.prim) { have += have.empty() ? "" : ", "; have += ALGOS[i].name; }
            }
            die("collbench: -a: no algorithm '%s' for %s (there are: %s)", n.c_str(), PRIM_NAMES[o.prim], have.c_str());
        }
    }
    for (int i = 0; i < N_ALGOS; i++) {
        if (ALGOS[i].prim != o.prim) { continue; }
        bool want = names.empty() || strcmp(ALGOS[i].name, "native") == 0;
        for (const std::string& n : names) { want |= n == ALGOS[i].name; }
        if (want) { out.push_back(&ALGOS[i]); }
    }
    return out;
}

// --- data: small integers that depend on (rank, index), exact in every type after any op

static void fill(void* buf, size_t n, CommType t, int rank) {
    for (size_t i = 0; i < n; i++) {
        int x = (int)((i * 2654435761u + (size_t)rank * 40503u) % 17u) - 8;
        if (t == COMM_FP32) { ((float*)buf)[i] = (float)x; }
        else if (t == COMM_INT32) { ((int32_t*)buf)[i] = x; }
        else { ((uint16_t*)buf)[i] = float_to_bf16((float)x); }
    }
}

// elements of the result this rank holds, at recv[0 .. n)
static void result_range(Prim pr, const Comm* c, size_t count, int root, size_t* n) {
    *n = count;
    if (pr == P_REDUCE_SCATTER || pr == P_SCATTER) {   // this rank's block, at recv[0]
        *n = comm_block_count(count, c->size, c->rank);
    }
    if ((pr == P_REDUCE || pr == P_GATHER) && c->rank != root) { *n = 0; }
}

// --- the nodes: which ranks share a machine (Open MPI's idea of a node)

// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) groups the ranks that can share memory: one group
// per node (a network namespace of our emulated cluster counts as one, its own hostname and
// /dev/shm). The layout is "regular" when every node has the same number n of ranks and node
// k holds ranks [k n, (k+1) n), the layout hierarchical.h assumes.
struct Nodes {
    int count = 1;                  // nodes
    int per_node = 1;               // ranks per node when regular
    bool regular = true;
    std::vector<int> sizes;         // ranks per node, in the order of their first rank
    std::vector<std::string> names; // each node's processor name (MPI_Get_processor_name of its first rank)
    std::vector<int> first;         // per rank: the first rank of its node
};

static Nodes find_nodes(const Comm* c) {
    int p = c->size;
    MPI_Comm node;
    MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    int mine[2] = {c->rank, 0};                       // the node's first world rank, its size
    MPI_Allreduce(&c->rank, &mine[0], 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_size(node, &mine[1]);
    MPI_Comm_free(&node);
    std::vector<int> all(2 * (size_t)p);
    MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, c->mpi);
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> names((size_t)p * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, c->mpi);
    Nodes n;
    n.sizes.clear();
    for (int r = 0; r < p; r++) {
        if (all[2 * r] == r) {                         // r is its node's first rank
            n.sizes.push_back(all[2 * r + 1]);
            n.names.push_back(std::string(&names[(size_t)r * MPI_MAX_PROCESSOR_NAME]));
        }
    }
    for (int r = 0; r < p; r++) { n.first.push_back(all[2 * r]); }
    n.count = (int)n.sizes.size();
    n.per_node = all[1];
    for (int r = 0; r < p; r++) {
        n.regular = n.regular && all[2 * r + 1] == n.per_node && all[2 * r] == r / n.per_node * n.per_node;
    }
    return n;
}

// --- alpha and beta: a ping-pong between two ranks over the transport

static double pingpong_half_rtt(Comm* c, void* buf, size_t bytes, int reps, int x, int y) {
    double best = 1e30;
    for (int k = 0; k < reps + 2; k++) {                    // two warm-up round trips
        MPI_Barrier(c->mpi);
        double t0 = MPI_Wtime();
        if (c->rank == x) {
            comm_send(c, buf, bytes, COMM_INT32, y);
            comm_recv(c, buf, bytes, COMM_INT32, y);
        } else if (c->rank == y) {
            comm_recv(c, buf, bytes, COMM_INT32, x);
            comm_send(c, buf, bytes, COMM_INT32, x);
        }
        double dt = (MPI_Wtime() - t0) / 2;
        if (k >= 2 && dt < best) { best = dt; }
    }
    MPI_Bcast(&best, 1, MPI_DOUBLE, x, c->mpi);
    return best;
}

// ranks x <-> y: alpha = half the round trip of a 4-byte message; beta from the slope up to 16 MiB
static void measure_alpha_beta(Comm* c, int x, int y, double* alpha, double* beta) {
    *alpha = 0;
    *beta = 0;
    if (c->size < 2) { return; }
    const size_t big = (size_t)16 << 20;
    void* buf = bench_alloc(c, big / 4, COMM_INT32);      // device memory in the device build
    bench_memset(c, buf, 1, big);
    double t_small = pingpong_half_rtt(c, buf, 1, 200, x, y);     // 1 int32 = 4 bytes
    double t_big = pingpong_half_rtt(c, buf, big / 4, 10, x, y);
    *alpha = t_small;
    *beta = std::max(t_big - t_small, 0.0) / (double)(big - 4);
    bench_free(buf);
    comm_reset_counters(c);
}

// beta_x: ranks x and y exchange `big` bytes both ways at once (one comm_sendrecv each, the
// call the algorithms make), best of a few; (time - alpha') / bytes is the time per byte each
// way of a pair that exchanges across the link (see "Exchanges" at the top).
static double measure_exchange_beta(Comm* c, int x, int y, double alpha) {
    const size_t big = (size_t)16 << 20, n = big / 4;
    void* out = bench_alloc(c, n, COMM_INT32);
    void* in = bench_alloc(c, n, COMM_INT32);
    bench_memset(c, out, 1, big);
    double best = 1e30;
    for (int k = 0; k < 4; k++) {                            // one warm-up, three timed
        MPI_Barrier(c->mpi);
        double t0 = MPI_Wtime();
        if (c->rank == x || c->rank == y) {
            int peer = c->rank == x ? y : x;
            comm_sendrecv(c, out, n, peer, in, n, peer, COMM_INT32);
        }
        double dt = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, c->mpi);   // the slower of the two
        if (k >= 1) { best = std::min(best, dt); }
    }
    bench_free(out);
    bench_free(in);
    comm_reset_counters(c);
    return std::max(best - alpha, 0.0) / (double)big;
}

// -L FILE: the links file the planner reads (./train_gpt2cpu --plan all --links FILE,
// llmc/planner/machine.h): "intra ALPHA_US GB_PER_S" and "inter ALPHA_US GB_PER_S shared", the
// links measured and nothing else ("shared": one link per node, as the models here assume). Ranks spanning nodes: both lines (the inter line only for
// nodes of one rank). One node: the intra line only; nothing between nodes was measured, and
// the planner keeps its --machine's link for a missing line (it needs one of the two). An
// irregular layout: the one link 0 <-> 1, as intra or inter by where ranks 0 and 1 sit. Rank 0
// writes FILE.tmp and renames it (common.h), so a reader never sees half a file.
static void write_links(const char* path, const Nodes& nodes, bool have_intra, const CommLinks& L) {
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    if (L.spans) {
        fprintf(f, "# collbench: %d nodes x %d rank(s); ping-pong %srank 0 <-> %d (inter); exchange (both ways at once) "
                "0 <-> %d: beta_x = %.4f ns per byte each way, %.2fx beta' (not a field: the planner has no exchange)\n",
                nodes.count, nodes.per_node, have_intra ? "rank 0 <-> 1 (intra), " : "", nodes.per_node, nodes.per_node,
                L.bx * 1e9, L.b2 > 0 ? L.bx / L.b2 : 0.0);
        if (have_intra) { fprintf(f, "intra %.3f %.6g\n", L.a * 1e6, 1e-9 / L.b); }
        // "shared": the model above assumes one network link per node, shared by its ranks
        // (drop the word for nodes with a network card per device)
        fprintf(f, "inter %.3f %.6g shared\n", L.a2 * 1e6, 1e-9 / L.b2);
    } else {
        bool same_node = nodes.first[0] == nodes.first[1];
        fprintf(f, "# collbench: %s: one link, ping-pong rank 0 <-> 1 (%s)\n",
                nodes.count == 1 ? "one node" : "nodes of an irregular layout", same_node ? "intra" : "inter");
        fprintf(f, "%s %.3f %.6g\n", same_node ? "intra" : "inter", L.a * 1e6, 1e-9 / L.b);
    }
    fclose_and_rename(f, tmp, path);
}

// gamma: seconds per byte of the local reduce (comm_reduce_local, fp32 sum, 16 MiB), which the
// alpha-beta model leaves out; on shared memory it is of the same order as beta. In the device
// build the buffers are device memory, so this is the reduce kernel (reduce_local.cuh).
static double measure_gamma(const Comm* c) {
    const size_t n = ((size_t)16 << 20) / 4;
    float* ha = (float*)comm_scratch(n, COMM_FP32);
    float* hb = (float*)comm_scratch(n, COMM_FP32);
    for (size_t i = 0; i < n; i++) { ha[i] = 1.0f; hb[i] = 2.0f; }
#ifdef COLLBENCH_DEVICE
    float* a = (float*)bench_alloc(c, n, COMM_FP32);
    float* b = (float*)bench_alloc(c, n, COMM_FP32);
    bench_upload(c, a, ha, n * 4);
    bench_upload(c, b, hb, n * 4);
#else
    (void)c;
    float* a = ha;
    float* b = hb;
#endif
    double best = 1e30;
    for (int k = 0; k < 4; k++) {
        double t0 = MPI_Wtime();
        comm_reduce_local(a, b, n, COMM_FP32, COMM_SUM);
        bench_sync(c);
        best = std::min(best, MPI_Wtime() - t0);
    }
#ifdef COLLBENCH_DEVICE
    bench_free(a);
    bench_free(b);
#endif
    free(ha);
    free(hb);
    return best / (double)(n * 4);
}

// --- the sweep

struct Row {
    const Algo* algo;
    size_t bytes;
    double busbw;
};

static std::string human(size_t b) {
    char s[32];
    if (b >= ((size_t)1 << 30) && b % ((size_t)1 << 30) == 0) { snprintf(s, sizeof(s), "%zuG", b >> 30); }
    else if (b >= ((size_t)1 << 20) && b % ((size_t)1 << 20) == 0) { snprintf(s, sizeof(s), "%zuM", b >> 20); }
    else if (b >= 1024 && b % 1024 == 0) { snprintf(s, sizeof(s), "%zuK", b >> 10); }
    else { snprintf(s, sizeof(s), "%zu", b); }
    return s;
}

// The algorithms of one size timed side by side: each gets -w warm-up runs and its number of
// runs per round (-n; -n 0: about 20 ms of calls, the same on every rank), then -R rounds are
// taken in turn, one round of each algorithm after the other, so that a slow spell of a shared
// machine falls on all of them alike and not on whichever was timed then. A round's time is the
// slowest rank's mean; each algorithm's fastest round counts, so that a rank descheduled by
// another job spoils one round only. The arguments were checked before (the data check), so no
// per-call agreement check here.
static double time_round(Comm* c, const Algo* a, const void* sendbuf, void* recvbuf, size_t call_count, const Opts& o, int iters) {
    MPI_Barrier(c->mpi);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++) { a->run(c, sendbuf, recvbuf, call_count, o.type, o.op, o.root); }
    bench_sync(c);                              // device build: the GPU's work is in the time
    double rt = (MPI_Wtime() - t0) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &rt, 1, MPI_DOUBLE, MPI_MAX, c->mpi);
    return rt;
}
static std::vector<double> time_algos(Comm* c, const std::vector<const Algo*>& algos, const void* sendbuf, void* recvbuf,
                                      size_t call_count, const Opts& o) {
    c->check_args = 0;
    std::vector<int> iters;
    for (const Algo* a : algos) {
        for (int k = 0; k < o.warmup; k++) { a->run(c, sendbuf, recvbuf, call_count, o.type, o.op, o.root); }
        bench_sync(c);
        int n = o.iters;
        if (n == 0) { n = (int)std::min(10000.0, std::max(2.0, 0.02 / std::max(time_round(c, a, sendbuf, recvbuf, call_count, o, 1), 1e-9))); }
        iters.push_back(n);
    }
    std::vector<double> dt(algos.size(), 1e30);
    for (int round = 0; round < o.rounds; round++) {
        for (size_t i = 0; i < algos.size(); i++) {
            dt[i] = std::min(dt[i], time_round(c, algos[i], sendbuf, recvbuf, call_count, o, iters[i]));
        }
    }
    c->check_args = 1;
    return dt;
}

#include "collbench_tune.h"

int main(int argc, char** argv) {
    Opts o = parse_opts(argc, argv);                         // before MPI: bad flags die on every rank
    Comm c = comm_init_world(&argc, &argv);
    die_set_rank(c.rank, c.size);                            // every error from here on: "error: [rank R] collbench: ..."
#ifdef COLLBENCH_DEVICE
    comm_select_device(&c);                                  // one GPU per rank, round robin on a node
    comm_enable_device(&c, o.staged);                        // NCCL, or the staged wire (-S 1, shared GPU)
    const char* buffers = c.staged ? "device (cudaMalloc), host-staged wire: pinned host copies over MPI"
                                   : "device (cudaMalloc), over NCCL";
#else
    const char* buffers = "host (malloc), over MPI";
#endif
    int p = c.size;
    bool rooted = o.prim == P_BROADCAST || o.prim == P_REDUCE || o.prim == P_GATHER || o.prim == P_SCATTER;
    if (o.root >= p) { die("collbench: -r %d is out of range for %d ranks", o.root, p); }
    if (o.servers > p) { die("collbench: -s %d servers is more than the %d ranks", o.servers, p); }
    if (o.links && p < 2) { die("collbench: -L needs at least 2 ranks (the links come from a ping-pong)"); }
    g_servers = o.servers;
    // Nodes and links: when the ranks span several nodes of equal size n with consecutive ranks,
    // two links, each measured by the ping-pong: inside a node (rank 0 <-> 1, when n >= 2) and
    // between nodes (rank 0 <-> n). Otherwise (one node, or an irregular layout) one link,
    // rank 0 <-> 1, used for every step of every model.
    Nodes nodes = find_nodes(&c);
    bool two_links = nodes.count > 1 && nodes.regular;
    g_node = o.node > 0 ? o.node : two_links ? nodes.per_node : default_node_size(p);
    if (p % g_node != 0) { die("collbench: -N %d does not divide the %d ranks into whole nodes", g_node, p); }
    g_rows = default_node_size(p);
    g_cols = p / g_rows;
    std::vector<const Algo*> algos = select_algos(o);
    size_t tsize = comm_type_size(o.type);

    CommLinks L;
    bool have_intra = !two_links || nodes.per_node >= 2;    // nodes of one rank: no link inside a node
    if (have_intra) { measure_alpha_beta(&c, 0, 1, &L.a, &L.b); }
    if (two_links) { measure_alpha_beta(&c, 0, nodes.per_node, &L.a2, &L.b2); }
    if (!two_links) { L.a2 = L.a; L.b2 = L.b; }
    L.bx = two_links ? measure_exchange_beta(&c, 0, nodes.per_node, L.a2) : L.b2;
    if (!have_intra) { L.a = L.a2; L.b = L.b2; }
    L.node = two_links ? nodes.per_node : p;
    L.spans = two_links;
    double gamma = measure_gamma(&c);
    if (o.links) {
        if (!(L.b > 0) || !(L.b2 > 0)) {
            die("collbench: -L: the ping-pong measured no time per byte (beta = 0), no bandwidth to write to '%s'", o.links);
        }
        if (c.rank == 0) { write_links(o.links, nodes, have_intra, L); }
    }
    if (o.tuning && !o.tune) { comm_tuning_load(&c, o.tuning); }
    if (o.tune) {
        tune_run(&c, o, L, nodes, have_intra, gamma);
        if (g_have_hier) { hier_plan_free(&g_hier_plan); }
        comm_free(&c);
        comm_finalize();
        return 0;
    }

    // buffers for the largest size: send (full), recv (full), and the native reference; host
    // memory in the CPU build, device memory in the device build, with host copies of the data
    // (sendhost: the input copied in; recvhost, refhost: the results copied back for the check)
    size_t max_count = o.maxbytes / tsize;
    size_t recv_n = max_count;
    void* sendbuf = bench_alloc(&c, max_count, o.type);
    void* recvbuf = bench_alloc(&c, recv_n, o.type);
    void* refbuf = bench_alloc(&c, recv_n, o.type);
#ifdef COLLBENCH_DEVICE
    void* sendhost = comm_scratch(max_count, o.type);
    void* recvhost = comm_scratch(recv_n, o.type);
    void* refhost = comm_scratch(recv_n, o.type);
#else
    void* sendhost = sendbuf;
    void* recvhost = NULL;
    void* refhost = NULL;
#endif
    fill(sendhost, max_count, o.type, c.rank);
    bench_upload(&c, sendbuf, sendhost, max_count * tsize);

    if (c.rank == 0) {
        std::string iters = o.iters > 0 ? std::to_string(o.iters) : "about 20 ms of";
        printf("# collbench: %s, %d ranks, type %s, op %s, root %d, iters %s x %d rounds (fastest round), warmup %d, check %d\n",
               PRIM_NAMES[o.prim], p, comm_type_name(o.type), comm_op_name(o.op), o.root, iters.c_str(), o.rounds, o.warmup, o.check);
        printf("# buffers: %s\n", buffers);
#ifdef COLLBENCH_DEVICE
        printf("# time: wall clock (MPI_Wtime) after cudaDeviceSynchronize; #wrong: results copied back to the host\n");
#endif
        auto link_line = [](const char* what, double a, double b) {
            printf("# ping-pong %s: alpha = %.2f us per message, beta = %.4f ns per byte (1/beta = %.2f GB/s)\n",
                   what, a * 1e6, b * 1e9, b > 0 ? 1e-9 / b : 0.0);
        };
        if (nodes.count > 1) {
            std::string names;
            for (int k = 0; k < nodes.count && k < 8; k++) { names += (k ? ", " : "") + nodes.names[k]; }
            if (nodes.count > 8) { names += ", ..."; }
            if (two_links) {
                printf("# nodes: %d x %d rank%s (%s)\n", nodes.count, nodes.per_node, nodes.per_node == 1 ? "" : "s", names.c_str());
            } else {
                std::string sizes;
                for (int k = 0; k < nodes.count; k++) { sizes += (k ? ", " : "") + std::to_string(nodes.sizes[k]); }
                printf("# nodes: %d (%s) of %s ranks, not consecutive blocks of equal size: one link, rank 0 <-> 1, "
                       "for every step of every model\n", nodes.count, names.c_str(), sizes.c_str());
            }
        }
        if (p >= 2) {
            if (two_links) {
                char what[64];
                if (have_intra) { link_line("rank 0 <-> 1 (inside a node)", L.a, L.b); }
                snprintf(what, sizeof(what), "rank 0 <-> %d (between nodes)", nodes.per_node);
                link_line(what, L.a2, L.b2);
                printf("# exchange rank 0 <-> %d (both ways at once): %.4f ns per byte each way (%.2f GB/s), %.2fx the "
                       "one-way beta\n", nodes.per_node, L.bx * 1e9, L.bx > 0 ? 1e-9 / L.bx : 0.0, L.b2 > 0 ? L.bx / L.b2 : 0.0);
                printf("# model: steps between nodes on the second link; the ranks of a node that cross at once share "
                       "its one network link; exchanges with one peer across nodes at the exchange beta\n");
                if (g_node != nodes.per_node) {
                    printf("# hierarchical: -N %d is not the %d ranks of a node: its models put every step on the slow link\n",
                           g_node, nodes.per_node);
                }
            } else if (nodes.count > 1) {       // irregular: the one link, wherever ranks 0 and 1 are
                link_line(nodes.first[0] == nodes.first[1] ? "rank 0 <-> 1 (inside a node)" : "rank 0 <-> 1 (between nodes)", L.a, L.b);
            } else {
                link_line("rank 0 <-> 1", L.a, L.b);
            }
            printf("# local reduce (not in the model): gamma = %.4f ns per byte (%.2f GB/s) on rank 0\n",
                   gamma * 1e9, gamma > 0 ? 1e-9 / gamma : 0.0);
            if (o.links) { printf("# links written to %s (the planner's --links)\n", o.links); }
        } else {
            printf("# one rank: no ping-pong, no model\n");
        }
        if (o.prim == P_ALLREDUCE) {
            printf("# parameter_server: %d server(s); hierarchical, hierarchical_leader: nodes of %d ranks; torus2d: %d x %d grid\n",
                   g_servers, g_node, g_rows, g_cols);
        }
        printf("# size is the full buffer S; busbw = algbw x %.3f (nccl-tests' factor for %s)\n",
               busbw_factor(o.prim, p), PRIM_NAMES[o.prim]);
        printf("#\n# %10s %12s %6s %6s %5s %-19s %11s %9s %9s %7s %11s %8s\n", "size(B)", "count", "type", "redop",
               "root", "algorithm", "time(us)", "algbw", "busbw", "#wrong", "model(us)", "/native");
        printf("# %10s %12s %6s %6s %5s %-19s %11s %9s %9s %7s %11s %8s\n", "", "(elements)", "", "", "", "", "",
               "(GB/s)", "(GB/s)", "", "", "busbw");
        fflush(stdout);
    }

    std::vector<Row> rows;
    long total_wrong = 0;
    for (double bd = (double)o.minbytes; bd <= (double)o.maxbytes * (1 + 1e-9); bd *= o.factor) {
        size_t count = (size_t)bd / tsize;
        if (o.prim == P_ALLTOALL) { count = count / p * p; }
        size_t bytes = count * tsize;
        size_t call_count = o.prim == P_ALLTOALL ? count / p : count;   // all-to-all takes the count per pair
        size_t n;
        result_range(o.prim, &c, count, o.root, &n);
        double native_busbw = 0;
        const void* ref = NULL;                              // host view of the reference
        if (o.check) {                                       // the reference: the native result
            bench_memset(&c, refbuf, 0x5a, recv_n * tsize);
            algos[0]->run(&c, sendbuf, refbuf, call_count, o.type, o.op, o.root);
            ref = bench_view(&c, refbuf, refhost, n * tsize);
        }
        // the data check of every algorithm: the native result first, then each one's, bit for bit
        std::vector<long> wrongs;
        for (const Algo* a : algos) {
            long wrong = 0;
            if (o.check) {
                c.check_args = 1;
                bench_memset(&c, recvbuf, 0x33, recv_n * tsize);
                a->run(&c, sendbuf, recvbuf, call_count, o.type, o.op, o.root);
                const void* got = bench_view(&c, recvbuf, recvhost, n * tsize);
                for (size_t i = 0; i < n; i++) {
                    wrong += memcmp(comm_at(got, i, o.type), comm_at(ref, i, o.type), tsize) != 0;
                }
                MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, c.mpi);
                total_wrong += wrong;
            }
            wrongs.push_back(wrong);
        }
        std::vector<double> times = time_algos(&c, algos, sendbuf, recvbuf, call_count, o);
        for (size_t ai = 0; ai < algos.size(); ai++) {
            const Algo* a = algos[ai];
            double dt = times[ai];
            double algbw = dt > 0 ? (double)bytes / dt / 1e9 : 0;
            double busbw = algbw * busbw_factor(o.prim, p);
            if (strcmp(a->name, "native") == 0) { native_busbw = busbw; }
            rows.push_back({a, bytes, busbw});
            if (c.rank == 0) {
                char model[32] = "-", ratio[32] = "-", wr[32] = "N/A";
                if (a->model != NULL && p >= 2) { snprintf(model, sizeof(model), "%.1f", a->model(L, (double)bytes, p) * 1e6); }
                if (native_busbw > 0 && busbw > 0) { snprintf(ratio, sizeof(ratio), "%.2f", busbw / native_busbw); }
                if (o.check) { snprintf(wr, sizeof(wr), "%ld", wrongs[ai]); }
                char rootcol[16];
                snprintf(rootcol, sizeof(rootcol), rooted ? "%d" : "-", o.root);
                printf("  %10zu %12zu %6s %6s %5s %-19s %11.1f %9.3f %9.3f %7s %11s %8s\n", bytes, count, comm_type_name(o.type),
                       comm_op_name(o.op), rootcol, a->name, dt * 1e6, algbw, busbw, wr, model, ratio);
                fflush(stdout);
            }
        }
        if (bd == 0) { bd = (double)tsize / o.factor; }      // -b 0: then one element
    }

    // --- summary
    if (c.rank == 0 && !rows.empty()) {
        printf("#\n# fastest %s algorithm by size (the crossover):\n", PRIM_NAMES[o.prim]);
        // per size, the winner; consecutive sizes with the same winner form one band
        std::string band_algo;
        size_t band_lo = 0, band_hi = 0;
        auto flush_band = [&]() {
            if (!band_algo.empty()) {
                printf("#   %8s .. %-8s %s\n", human(band_lo).c_str(), human(band_hi).c_str(), band_algo.c_str());
            }
        };
        for (size_t i = 0; i < rows.size();) {
            size_t j = i;
            const Row* best = &rows[i];
            while (j < rows.size() && rows[j].bytes == rows[i].bytes) {
                if (rows[j].busbw > best->busbw) { best = &rows[j]; }
                j++;
            }
            if (band_algo != best->algo->name) {
                flush_band();
                band_algo = best->algo->name;
                band_lo = rows[i].bytes;
            }
            band_hi = rows[i].bytes;
            i = j;
        }
        flush_band();
        printf("# busbw / native busbw, per algorithm: at the largest size (min .. max over all sizes)\n");
        size_t largest = rows.back().bytes;
        for (const Algo* a : algos) {
            double at_largest = 0, lo = 1e30, hi = 0, native = 0;
            for (const Row& r : rows) {
                if (strcmp(r.algo->name, "native") == 0) { native = r.busbw; }   // native comes first at each size
                if (r.algo != a || native <= 0) { continue; }
                double ratio = r.busbw / native;
                lo = std::min(lo, ratio);
                hi = std::max(hi, ratio);
                if (r.bytes == largest) { at_largest = ratio; }
            }
            if (hi > 0) {
                printf("#   %-19s %5.2f at %s  (%.2f .. %.2f)\n", a->name, at_largest, human(largest).c_str(), lo, hi);
            }
        }
        if (o.check) { printf("# #wrong in total: %ld\n", total_wrong); }
        fflush(stdout);
    }
    if (g_have_hier) { hier_plan_free(&g_hier_plan); }
    if (g_have_torus) { hier_plan_free(&g_torus_plan); }
    bench_free(sendbuf);
    bench_free(recvbuf);
    bench_free(refbuf);
#ifdef COLLBENCH_DEVICE
    free(sendhost);
    free(recvhost);
    free(refhost);
#endif
    comm_free(&c);                                           // device build: NCCL communicator and stream too
    comm_finalize();
    return total_wrong == 0 ? 0 : 2;
}
#endif
