// llmc/comm/ in the build without MPI (llmc/comm/mpi_single.h): the world and every
// communicator split from it have size 1, and every collective of the library, native and
// educational, must give back its input (the all-reduce avg of one rank is itself), in place
// and out of place, for every type and op, without sending a byte. Also the MPI calls the
// trainer makes directly, and the point-to-point calls, which must die naming the call.
//
//   make test_comm_singlecpu && ./test_comm_singlecpu     one PASS/FAIL line per group
#include <sys/wait.h>
#include <unistd.h>
#include <string>
#include "../llmc/comm/native.h"
#include "../llmc/comm/ring.h"
#include "../llmc/comm/tree.h"
#include "../llmc/comm/recursive.h"
#include "../llmc/comm/alltoall.h"
#include "../llmc/comm/bruck.h"
#include "../llmc/comm/ps.h"
#include "../llmc/comm/hierarchical.h"
#include "../llmc/comm/torus.h"

static Comm W;
static HierPlan g_plan;
static int failed_groups = 0;
static const CommType TYPES[] = {COMM_FP32, COMM_BF16, COMM_INT32};
static const CommOp OPS[] = {COMM_SUM, COMM_AVG, COMM_MAX, COMM_MIN};
static const size_t COUNTS[] = {0, 1, 7, 1009};

static void report(const char* name, long cases, const std::string& first_failure) {
    if (first_failure.empty()) {
        printf("PASS %s p=1 (%ld cases)\n", name, cases);
    } else {
        printf("FAIL %s p=1: %s\n", name, first_failure.c_str());
        failed_groups++;
    }
}

// Every collective as f(comm, send, recv, count, type, op): one rank's result is its input.
// Rooted ones use root 0; broadcast broadcasts recv after copying send into it. In place:
// send == recv (the own block of the full buffer is all of it with one rank).
typedef void (*Fn)(Comm*, const void*, void*, size_t, CommType, CommOp);
struct Case { const char* name; Fn fn; bool reduces; bool out_of_place_only = false; };

static void run_case(const Case& k) {
    long cases = 0;
    std::string first;
    for (CommType t : TYPES) for (CommOp op : OPS) for (size_t n : COUNTS) for (int in_place = 0; in_place < 2; in_place++) {
        if ((!k.reduces && op != COMM_SUM) || (k.out_of_place_only && in_place)) { continue; }
        size_t bytes = n * comm_type_size(t);
        char* send = (char*)comm_scratch(n, t);
        char* orig = (char*)comm_scratch(n, t);
        for (size_t i = 0; i < n; i++) {   // small integers, each type's own bits
            int v = (int)((i * 37 + n + 3 * t) % 17) - 8;
            if (t == COMM_FP32) { ((float*)send)[i] = (float)v; }
            else if (t == COMM_INT32) { ((int32_t*)send)[i] = v; }
            else { ((uint16_t*)send)[i] = float_to_bf16((float)v); }
        }
        memcpy(orig, send, bytes);
        char* out = in_place ? send : (char*)comm_scratch(n, t);
        if (!in_place) { memset(out, 0x7b, bytes); }
        comm_reset_counters(&W);
        k.fn(&W, send, out, n, t, op);
        const char* why = NULL;
        if (memcmp(out, orig, bytes) != 0) { why = "result differs from the input"; }
        else if (memcmp(send, orig, bytes) != 0) { why = "modified its send buffer"; }
        else if (W.bytes_sent != 0 || W.messages_sent != 0) { why = "sent something"; }
        if (why && first.empty()) {
            char msg[256];
            snprintf(msg, sizeof(msg), "%s %s count %zu %s: %s", comm_type_name(t), comm_op_name(op), n,
                     in_place ? "in place" : "out of place", why);
            first = msg;
        }
        cases++;
        free(send); free(orig);
        if (!in_place) { free(out); }
    }
    report(k.name, cases, first);
}

#define R(call) [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp op) { (void)op; call; }
#define BCAST(call) [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp) { comm_copy(r, s, n, t); call; }
#define ALLTOALLV(fn) [](Comm* c, const void* s, void* r, size_t n, CommType t, CommOp) { \
    size_t counts[1] = {n}, displs[1] = {0}; fn(c, s, counts, displs, r, counts, displs, t); }

static const Case CASES[] = {
    {"allreduce native", R(allreduce_native(c, s, r, n, t, op)), true},
    {"allreduce ring", R(allreduce_ring(c, s, r, n, t, op)), true},
    {"allreduce recursive_doubling", R(allreduce_recursive_doubling(c, s, r, n, t, op)), true},
    {"allreduce rabenseifner", R(allreduce_rabenseifner(c, s, r, n, t, op)), true},
    {"allreduce parameter_server S=1", R(allreduce_parameter_server(c, s, r, n, t, op, 1)), true},
    {"allreduce hierarchical node=1 inter=ring", R(allreduce_hierarchical(c, s, r, n, t, op, 1, HIER_INTER_RING)), true},
    {"allreduce hierarchical node=1 inter=recursive_doubling",
     R(allreduce_hierarchical(c, s, r, n, t, op, 1, HIER_INTER_RECURSIVE_DOUBLING)), true},
    {"allreduce hierarchical plan node=1", R(allreduce_hierarchical_plan(c, &g_plan, s, r, n, t, op, HIER_INTER_RING)), true},
    {"allreduce hierarchical_leader node=1 inter=ring", R(allreduce_hierarchical_leader(c, s, r, n, t, op, 1, HIER_INTER_RING)), true},
    {"allreduce hierarchical_leader plan node=1", R(allreduce_hierarchical_leader_plan(c, &g_plan, s, r, n, t, op, HIER_INTER_RING)), true},
    {"allreduce torus2d 1x1", R(allreduce_torus2d(c, s, r, n, t, op, 1, 1)), true},
    {"reduce native", R(reduce_native(c, s, r, n, t, op, 0)), true},
    {"reduce tree", R(reduce_tree(c, s, r, n, t, op, 0)), true},
    {"reduce_scatter native", R(reduce_scatter_native(c, s, r, n, t, op)), true},
    {"reduce_scatter ring", R(reduce_scatter_ring(c, s, r, n, t, op)), true},
    {"reduce_scatter recursive_halving", R(reduce_scatter_recursive_halving(c, s, r, n, t, op)), true},
    {"allgather native", R(allgather_native(c, s, r, n, t)), false},
    {"allgather ring", R(allgather_ring(c, s, r, n, t)), false},
    {"allgather recursive_doubling", R(allgather_recursive_doubling(c, s, r, n, t)), false},
    {"allgather bruck", R(allgather_bruck(c, s, r, n, t)), false},
    {"gather native", R(gather_native(c, s, r, n, t, 0)), false},
    {"scatter native", R(scatter_native(c, s, r, n, t, 0)), false},
    {"broadcast native", BCAST(broadcast_native(c, r, n, t, 0)), false},
    {"broadcast ring", BCAST(broadcast_ring(c, r, n, t, 0)), false},
    {"broadcast ring chunk=7", BCAST(broadcast_ring_chunked(c, r, n, t, 0, 7)), false},
    {"broadcast tree", BCAST(broadcast_tree(c, r, n, t, 0)), false},
    {"alltoall native", R(alltoall_native(c, s, r, n, t)), false},
    {"alltoall pairwise", R(alltoall_pairwise(c, s, r, n, t)), false},
    {"alltoall bruck", R(alltoall_bruck(c, s, r, n, t)), false},
    {"alltoallv native", ALLTOALLV(alltoallv_native), false, true},
    {"alltoallv pairwise", ALLTOALLV(alltoallv_pairwise), false, true},
};

// the world and communicators made from it: size 1, rank 0; an all-reduce on a split one
static void test_world_and_split() {
    std::string first;
    if (comm_mpi_available() != 0) { first = "comm_mpi_available() is 1 in the build without MPI"; }
    if (W.size != 1 || W.rank != 0 || W.world_rank != 0) { first = "the world is not one rank 0"; }
    Comm half = comm_split(&W, 0, 0, "half");
    int mine = 42, sum = 0;
    allreduce_ring(&half, &mine, &sum, 1, COMM_INT32, COMM_SUM);
    if (half.size != 1 || half.rank != 0 || sum != 42) { first = "comm_split: not a size-1 communicator, or its all-reduce failed"; }
    comm_free(&half);
    if (half.mpi != MPI_COMM_NULL) { first = "comm_free left the communicator set"; }
    barrier_native(&W);
    report("world and comm_split", 5, first);
}

// the MPI calls train_gpt2.cu and llmc/parallel/ make themselves
static void test_direct_mpi() {
    std::string first;
    int provided = -1;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED) { first = "MPI_Init_thread: provided below MPI_THREAD_SERIALIZED"; }
    MPI_Comm node;
    int local = -1, n = -1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    if (local != 0 || n != 1) { first = "MPI_Comm_split_type: not rank 0 of 1"; }
    double x = 2.5;
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, W.mpi);
    long long lo = 0, v = -7;
    MPI_Allreduce(&v, &lo, 1, MPI_LONG_LONG, MPI_MIN, W.mpi);
    if (x != 2.5 || lo != -7) { first = "MPI_Allreduce: not the input"; }
    float mine[3] = {1, 2, 3}, all[3] = {0, 0, 0};
    MPI_Allgather(mine, 3, MPI_FLOAT, all, 3, MPI_FLOAT, W.mpi);
    if (memcmp(mine, all, sizeof(mine)) != 0) { first = "MPI_Allgather: not the input"; }
    int len = 5, lens[1] = {0}, displs[1] = {0};
    char text[6] = "hello", got[6] = "";
    MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Gatherv(text, len, MPI_CHAR, got, lens, displs, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (lens[0] != 5 || strcmp(got, "hello") != 0) { first = "MPI_Gather/MPI_Gatherv: not the input"; }
    double t0 = MPI_Wtime();
    if (!(MPI_Wtime() >= t0)) { first = "MPI_Wtime goes back"; }
    // the v-variants (native.h calls them only when count % p != 0: never with p = 1), block 0
    // at displacement 2, and MPI_IN_PLACE
    int src[5] = {0, 0, 7, 8, 9}, dst[5], three[1] = {3}, two[1] = {2};
    int want[5] = {-1, -1, 7, 8, 9};
    memset(dst, 0xff, sizeof(dst));
    MPI_Allgatherv(src + 2, 3, MPI_INT, dst, three, two, MPI_INT, W.mpi);
    if (memcmp(dst, want, sizeof(dst)) != 0) { first = "MPI_Allgatherv: block 0 not at its displacement"; }
    memset(dst, 0xff, sizeof(dst));
    MPI_Scatterv(src, three, two, MPI_INT, dst + 2, 3, MPI_INT, 0, W.mpi);
    if (memcmp(dst, want, sizeof(dst)) != 0) { first = "MPI_Scatterv: block 0 not from its displacement"; }
    memset(dst, 0xff, sizeof(dst));
    MPI_Alltoallv(src, three, two, MPI_INT, dst, three, two, MPI_INT, W.mpi);
    if (memcmp(dst, want, sizeof(dst)) != 0) { first = "MPI_Alltoallv: block 0 not at its displacements"; }
    memset(dst, 0xff, sizeof(dst));
    MPI_Reduce_scatter(src + 2, dst + 2, three, MPI_INT, MPI_SUM, W.mpi);
    MPI_Reduce_scatter(MPI_IN_PLACE, dst + 2, three, MPI_INT, MPI_MAX, W.mpi);
    MPI_Reduce_scatter_block(MPI_IN_PLACE, dst + 2, 3, MPI_INT, MPI_MIN, W.mpi);
    MPI_Reduce(MPI_IN_PLACE, dst + 2, 3, MPI_INT, MPI_SUM, 0, W.mpi);
    MPI_Bcast(dst, 5, MPI_INT, 0, W.mpi);
    if (memcmp(dst, want, sizeof(dst)) != 0) { first = "MPI_Reduce_scatter / in place: not the input"; }
    report("direct MPI calls", 13, first);
}

// MPI_Send, MPI_Recv, MPI_Sendrecv have no peer: each must exit 1 with a message naming it
static void test_p2p_dies() {
    std::string first;
    const char* calls[] = {"MPI_Send", "MPI_Recv", "MPI_Sendrecv"};
    for (int k = 0; k < 3; k++) {
        int fds[2];
        if (pipe(fds) != 0) { die("pipe failed"); }
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(fds[1], 2);
            int a = 1, b = 0;
            if (k == 0) { MPI_Send(&a, 1, MPI_INT, 0, 1, W.mpi); }
            if (k == 1) { MPI_Recv(&b, 1, MPI_INT, 0, 1, W.mpi, MPI_STATUS_IGNORE); }
            if (k == 2) { MPI_Sendrecv(&a, 1, MPI_INT, 0, 1, &b, 1, MPI_INT, 0, 1, W.mpi, MPI_STATUS_IGNORE); }
            _exit(0);
        }
        close(fds[1]);
        char msg[1024];
        ssize_t got = read(fds[0], msg, sizeof(msg) - 1);
        msg[got > 0 ? got : 0] = 0;
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 || strstr(msg, calls[k]) == NULL) {
            first = std::string(calls[k]) + " did not die naming itself (stderr: '" + msg + "')";
        }
    }
    report("point-to-point dies", 3, first);
}

int main(int argc, char** argv) {
    W = comm_init_world(&argc, &argv);
    test_world_and_split();
    test_direct_mpi();
    g_plan = hier_plan_make(&W, "test", 1);
    for (const Case& k : CASES) { run_case(k); }
    hier_plan_free(&g_plan);
    test_p2p_dies();
    printf("p=1 without MPI: %d failing groups\n", failed_groups);
    comm_free(&W);
    comm_finalize();
    return failed_groups > 0 ? 1 : 0;
}
