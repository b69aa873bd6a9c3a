// The device path of llmc/comm/ (CUDA build): native and ring collectives on device buffers,
// over both wires (NCCL, and staged MPI through host copies), bit for bit against the result
// computed locally on the host, and the ring's counted bytes against its formula; then, on
// random (order-sensitive) values, every collective on device buffers bit for bit against the
// same call on host buffers over a host communicator (MPI itself for the native ones), and so
// every educational algorithm (ring, tree, recursive doubling/halving, Rabenseifner, Bruck,
// pairwise, parameter server, hierarchical and its leader variant, torus), in place where it has
// a scratch path for it. Each pass runs on a blocking and on a non-blocking communicator stream.
// The device path's own machinery:
//   - scratch: no algorithm on device buffers takes host scratch (comm_host_scratch_count stays
//     put: a local reduce done on the host would move it too), comm_scratch of a device
//     communicator is device memory, and repeating the same calls allocates nothing new (the
//     communicator's kept buffers);
//   - events: a kernel on the compute stream writes the input, backend_event_record +
//     comm_wait_event, then the collective on a non-blocking communicator sees the kernel's
//     data. Under the emulator (whose streams run work as late as CUDA allows) the same without
//     comm_wait_event must see the old data, which shows the check can fail; a blocking stream
//     needs no event (CUDA orders it after the compute stream's earlier work).
//
// Needs one GPU per rank for the NCCL wire: when ranks share a GPU, comm_enable_device falls
// back to the staged wire, and the NCCL pass prints a SKIP line (not counted as PASS) instead
// of repeating the staged one. Built by scripts/nvcc_check.sh with nvcc, NCCL and MPI, and by
// `make build/emu/test_collectives_device` for the CPU emulator (dev/emu/: every emulated rank
// shares the one emulated GPU, so only the staged wire runs; test/test_emu_collectives.sh):
//   mpirun -np 2 ./test_collectives_device      one PASS/FAIL line per group, wire and stream
#ifdef LLMC_CPU
#include <stdio.h>
int main() {
    printf("test_collectives_device: the CPU build has no device path, nothing to test\n");
    return 0;
}
#else
#include <functional>
#include <string>
#include <utility>
#include <vector>
#include "../llmc/comm/native.h"
#include "../llmc/comm/ring.h"
#include "../llmc/comm/tree.h"
#include "../llmc/comm/recursive.h"
#include "../llmc/comm/bruck.h"
#include "../llmc/comm/alltoall.h"
#include "../llmc/comm/ps.h"
#include "../llmc/comm/torus.h"
#include "../llmc/cuda/event.cuh"

static const CommType TYPES[] = {COMM_FP32, COMM_BF16, COMM_INT32};
static const CommOp OPS[] = {COMM_SUM, COMM_AVG, COMM_MAX, COMM_MIN};

// small integers, exact in fp32 and bf16 whatever the order of the additions
static int value(int rank, size_t i) { return (int)(((uint32_t)i * 2654435761u ^ (uint32_t)(rank * 40503 + 7)) % 17) - 8; }

static void store(void* buf, size_t i, CommType t, double x) {
    if (t == COMM_FP32) { ((float*)buf)[i] = (float)x; }
    else if (t == COMM_INT32) { ((int32_t*)buf)[i] = (int32_t)x; }
    else { ((uint16_t*)buf)[i] = float_to_bf16((float)x); }
}

static void check(const Comm* c, const char* call, cudaError_t e) { comm_cuda_check(c, call, e); }

// a device buffer holding this rank's input, and the host copy of the same values
struct DevBuf {
    const Comm* c;
    void* d = NULL;
    std::vector<char> h;
    DevBuf(const Comm* cc, size_t n, CommType t, int rank) : c(cc), h(n * comm_type_size(t) + 1) {
        for (size_t i = 0; i < n; i++) { store(h.data(), i, t, value(rank, i)); }
        check(c, "cudaMalloc", cudaMalloc(&d, h.size()));
        check(c, "cudaMemcpy", cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
    }
    std::vector<char> to_host() const {
        std::vector<char> out(h.size());
        check(c, "cudaMemcpy", cudaMemcpy(out.data(), d, out.size(), cudaMemcpyDeviceToHost));
        return out;
    }
    ~DevBuf() { cudaFree(d); }
};

static int failures = 0;

static void report(Comm* c, const std::string& name, long cases, long failed) {
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_LONG, MPI_SUM, c->mpi);
    if (c->rank == 0) {
        printf("%s %s %s%s p=%d (%ld cases)\n", failed == 0 ? "PASS" : "FAIL", name.c_str(), c->staged ? "staged" : "nccl",
               c->nonblocking ? " non-blocking" : "", c->size, cases);
        fflush(stdout);
    }
    failures += failed > 0;
}

// The inputs were written on the compute stream (cudaMemset, a kernel): a non-blocking
// communicator stream must be told (a blocking one is ordered after them anyway)
static void inputs_ready(Comm* c) {
    static BackendEvent e = backend_event_create();
    backend_event_record(e);
    comm_wait_event(c, e);
}

// all-reduce, native and ring, against the reduction computed on the host
static void test_allreduce(Comm* c) {
    int p = c->size;
    std::vector<size_t> counts = {0, 1, (size_t)p - 1, (size_t)p, 1009, (1u << 20) + 3};
    long cases = 0, failed = 0, vol_failed = 0;
    for (CommType t : TYPES) {
        for (CommOp op : OPS) {
            for (size_t n : counts) {
                std::vector<char> want(n * comm_type_size(t) + 1);
                for (size_t i = 0; i < n; i++) {
                    int acc = value(0, i);
                    for (int r = 1; r < p; r++) {
                        int x = value(r, i);
                        acc = op == COMM_MAX ? std::max(acc, x) : op == COMM_MIN ? std::min(acc, x) : acc + x;
                    }
                    store(want.data(), i, t, acc);
                }
                comm_avg_finish(want.data(), n, t, op, p);   // host buffer: the host loop
                for (int algo = 0; algo < 2; algo++) {
                    DevBuf in(c, n, t, c->rank), out(c, n, t, c->rank);
                    inputs_ready(c);
                    comm_reset_counters(c);
                    if (algo == 0) { allreduce_native(c, in.d, out.d, n, t, op); }
                    else { allreduce_ring(c, in.d, out.d, n, t, op); }
                    std::vector<char> got = out.to_host();
                    cases++;
                    if (n > 0 && memcmp(got.data(), want.data(), n * comm_type_size(t)) != 0) { failed++; }
                    if (algo == 1 && c->bytes_sent != allreduce_ring_volume(n, t, p, c->rank).bytes) { vol_failed++; }
                }
            }
        }
    }
    report(c, "allreduce native+ring on device buffers", cases, failed);
    report(c, "allreduce ring counted bytes", cases / 2, vol_failed);
}

// broadcast, all-gather and reduce-scatter (native) on device buffers, uneven counts included
static void test_movement(Comm* c) {
    int p = c->size;
    long cases = 0, failed = 0;
    for (CommType t : TYPES) {
        for (size_t n : {(size_t)1, (size_t)p, (size_t)(3 * p + 1)}) {
            size_t es = comm_type_size(t);
            // broadcast from the last rank: everyone ends with its values
            DevBuf b(c, n, t, c->rank);
            inputs_ready(c);
            broadcast_native(c, b.d, n, t, p - 1);
            std::vector<char> want(n * es + 1);
            for (size_t i = 0; i < n; i++) { store(want.data(), i, t, value(p - 1, i)); }
            cases++;
            failed += memcmp(b.to_host().data(), want.data(), n * es) != 0;
            // all-gather: block r of rank r's input
            DevBuf g(c, n, t, c->rank), full(c, n, t, c->rank);
            size_t off = comm_block_offset(n, p, c->rank);
            inputs_ready(c);
            allgather_native(c, comm_at(g.d, off, t), full.d, n, t);
            for (int r = 0; r < p; r++) {
                for (size_t i = comm_block_offset(n, p, r); i < comm_block_offset(n, p, r) + comm_block_count(n, p, r); i++) {
                    store(want.data(), i, t, value(r, i));
                }
            }
            cases++;
            failed += memcmp(full.to_host().data(), want.data(), n * es) != 0;
            // reduce-scatter (sum), in place
            DevBuf rs(c, n, t, c->rank);
            inputs_ready(c);
            reduce_scatter_native(c, rs.d, comm_at(rs.d, off, t), n, t, COMM_SUM);
            std::vector<char> got = rs.to_host();
            bool ok = true;
            for (size_t i = off; i < off + comm_block_count(n, p, c->rank); i++) {
                int acc = 0;
                for (int r = 0; r < p; r++) { acc += value(r, i); }
                char one[4];
                store(one, 0, t, acc);
                ok = ok && memcmp(got.data() + i * es, one, es) == 0;
            }
            cases++;
            failed += !ok;
        }
    }
    report(c, "broadcast/allgather/reduce_scatter native on device buffers", cases, failed);
}

// random values: every bit of the result depends on the order of the additions, so the device
// path must take the host path's order (MPI's, for the native collectives) and its arithmetic
static uint32_t mix(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
static void fill_random(void* buf, size_t n, CommType t, int rank, int salt) {
    for (size_t i = 0; i < n; i++) {
        uint32_t h = mix((uint32_t)i * 2654435761u ^ mix((uint32_t)(rank * 977 + salt)));
        // mantissa random, exponent over 2^-12..2^3: sums round differently in every order
        float x = ldexpf((float)(h & 0xffffff) / (float)0x1000000 + 0.5f, (int)((h >> 24) % 16) - 12);
        if (h & 0x80000000u) { x = -x; }
        if (t == COMM_FP32) { ((float*)buf)[i] = x; }
        else if (t == COMM_INT32) { ((int32_t*)buf)[i] = (int32_t)h; }   // int sums wrap
        else { ((uint16_t*)buf)[i] = float_to_bf16(x); }
    }
}

// every collective on device buffers (device communicator d) against the same call on host
// buffers (host communicator h, the same ranks): equal bit for bit
static void test_vs_host(Comm* d, Comm* h) {
    int p = d->size;
    long cases = 0, failed = 0;
    for (CommType t : TYPES) {
        size_t es = comm_type_size(t);
        for (size_t n : {(size_t)1, (size_t)(3 * p + 1), (size_t)1009, (size_t)(1u << 16) + 5}) {
            size_t bytes = n * es, off = comm_block_offset(n, p, d->rank), mine = comm_block_count(n, p, d->rank);
            std::vector<char> in(bytes + 1), host(bytes + 1), got(bytes + 1);
            void *din = NULL, *dout = NULL;
            check(d, "cudaMalloc", cudaMalloc(&din, bytes));
            check(d, "cudaMalloc", cudaMalloc(&dout, bytes));
            for (int kind = 0; kind < 5; kind++) {
                for (CommOp op : OPS) {
                    if (kind >= 3 && op != COMM_SUM) { continue; }   // movement: no op
                    fill_random(in.data(), n, t, d->rank, kind * 4 + (int)op);
                    std::fill(host.begin(), host.end(), 0);
                    check(d, "cudaMemcpy", cudaMemcpy(din, in.data(), bytes, cudaMemcpyHostToDevice));
                    check(d, "cudaMemset", cudaMemset(dout, 0, bytes));
                    inputs_ready(d);
                    size_t cmp_off = 0, cmp_n = n;
                    if (kind == 0) {
                        allreduce_native(h, in.data(), host.data(), n, t, op);
                        allreduce_native(d, din, dout, n, t, op);
                    } else if (kind == 1) {
                        allreduce_ring(h, in.data(), host.data(), n, t, op);
                        allreduce_ring(d, din, dout, n, t, op);
                    } else if (kind == 2) {   // reduce-scatter: rank r's block
                        reduce_scatter_native(h, in.data(), host.data() + off * es, n, t, op);
                        reduce_scatter_native(d, din, comm_at(dout, off, t), n, t, op);
                        cmp_off = off, cmp_n = mine;
                    } else if (kind == 3) {   // all-gather of rank r's block of its own values
                        allgather_native(h, in.data() + off * es, host.data(), n, t);
                        allgather_native(d, comm_at(din, off, t), dout, n, t);
                    } else {
                        reduce_scatter_ring(h, in.data(), host.data() + off * es, n, t, COMM_SUM);
                        reduce_scatter_ring(d, din, comm_at(dout, off, t), n, t, COMM_SUM);
                        cmp_off = off, cmp_n = mine;
                    }
                    check(d, "cudaMemcpy", cudaMemcpy(got.data(), dout, bytes, cudaMemcpyDeviceToHost));
                    cases++;
                    failed += cmp_n > 0 && memcmp(got.data() + cmp_off * es, host.data() + cmp_off * es, cmp_n * es) != 0;
                }
            }
            cudaFree(din);
            cudaFree(dout);
        }
    }
    report(d, "random values: device buffers = host buffers bit for bit (allreduce native/ring, reduce_scatter native/ring, allgather)",
           cases, failed);
}

// --- every educational algorithm on device buffers against the same on host buffers

// one algorithm: run it on (in, out) over c (out receives; in place variants copy in to out
// first and run on out), and the element range [lo, hi) of out this rank compares
struct AlgoCase {
    const char* name;
    bool reduces;   // takes an op (else run once, with COMM_SUM)
    std::function<void(Comm* c, void* in, void* out, size_t n, CommType t, CommOp op)> run;
    std::function<std::pair<size_t, size_t>(const Comm* c, size_t n)> span;
};

static std::pair<size_t, size_t> all_of(const Comm* c, size_t n) { (void)c; return {0, n}; }
static std::pair<size_t, size_t> own_block(const Comm* c, size_t n) {
    size_t off = comm_block_offset(n, c->size, c->rank);
    return {off, off + comm_block_count(n, c->size, c->rank)};
}
static std::pair<size_t, size_t> all_pairs(const Comm* c, size_t n) { return {0, n * (size_t)c->size}; }
static std::pair<size_t, size_t> at_last_rank(const Comm* c, size_t n) { return {0, c->rank == c->size - 1 ? n : 0}; }
// all-to-all-v: rank r sends (r + j) % 3 + 1 elements to rank j, packed; receives likewise
static size_t v_count(int from, int to) { return (size_t)((from + to) % 3 + 1); }
static std::pair<size_t, size_t> v_received(const Comm* c, size_t n) {
    (void)n;
    size_t total = 0;
    for (int j = 0; j < c->size; j++) { total += v_count(j, c->rank); }
    return {0, total};
}

static std::vector<AlgoCase> algo_cases(int p) {
    int node = p % 2 == 0 ? 2 : p, rows = p % 2 == 0 ? 2 : 1;
    auto off = [](const Comm* c, void* b, size_t n, CommType t) { return comm_at(b, comm_block_offset(n, c->size, c->rank), t); };
    std::vector<AlgoCase> v = {
        {"allreduce_ring", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_ring(c, in, out, n, t, op); }, all_of},
        {"allreduce_ring in place", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            comm_copy(c, out, in, n, t); allreduce_ring(c, out, out, n, t, op); }, all_of},
        {"reduce_scatter_ring", true, [off](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            reduce_scatter_ring(c, in, off(c, out, n, t), n, t, op); }, own_block},
        {"reduce_scatter_ring in place", true, [off](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            comm_copy(c, out, in, n, t); reduce_scatter_ring(c, out, off(c, out, n, t), n, t, op); }, own_block},
        {"allgather_ring", false, [off](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            allgather_ring(c, off(c, in, n, t), out, n, t); }, all_of},
        {"broadcast_ring (chunks of 64)", false, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            comm_copy(c, out, in, n, t); broadcast_ring_chunked(c, out, n, t, c->size - 1, 64); }, all_of},
        {"broadcast_tree", false, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            comm_copy(c, out, in, n, t); broadcast_tree(c, out, n, t, c->size - 1); }, all_of},
        {"reduce_tree", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            reduce_tree(c, in, out, n, t, op, c->size - 1); }, at_last_rank},
        {"reduce_tree in place", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            comm_copy(c, out, in, n, t); reduce_tree(c, out, out, n, t, op, c->size - 1); }, at_last_rank},
        {"allreduce_recursive_doubling", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_recursive_doubling(c, in, out, n, t, op); }, all_of},
        {"reduce_scatter_recursive_halving in place", true, [off](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            comm_copy(c, out, in, n, t); reduce_scatter_recursive_halving(c, out, off(c, out, n, t), n, t, op); }, own_block},
        {"allgather_recursive_doubling", false, [off](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            allgather_recursive_doubling(c, off(c, in, n, t), out, n, t); }, all_of},
        {"allreduce_rabenseifner", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_rabenseifner(c, in, out, n, t, op); }, all_of},
        {"allgather_bruck", false, [off](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            allgather_bruck(c, off(c, in, n, t), out, n, t); }, all_of},
        {"alltoall_bruck in place", false, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            comm_copy(c, out, in, n * c->size, t); alltoall_bruck(c, out, out, n, t); }, all_pairs},
        {"alltoall_pairwise", false, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            alltoall_pairwise(c, in, out, n, t); }, all_pairs},
        {"alltoall_pairwise in place", false, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            comm_copy(c, out, in, n * c->size, t); alltoall_pairwise(c, out, out, n, t); }, all_pairs},
        {"alltoallv_pairwise", false, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp) {
            (void)n;
            int q = c->size;
            std::vector<size_t> sc(q), sd(q), rc(q), rd(q);
            for (int j = 0; j < q; j++) {
                sc[j] = v_count(c->rank, j);
                rc[j] = v_count(j, c->rank);
                sd[j] = j == 0 ? 0 : sd[j - 1] + sc[j - 1];
                rd[j] = j == 0 ? 0 : rd[j - 1] + rc[j - 1];
            }
            alltoallv_pairwise(c, in, sc.data(), sd.data(), out, rc.data(), rd.data(), t); }, v_received},
        {"allreduce_parameter_server 1 server", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_parameter_server(c, in, out, n, t, op, 1); }, all_of},
        {"allreduce_parameter_server p servers", true, [](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_parameter_server(c, in, out, n, t, op, c->size); }, all_of},
        {"allreduce_hierarchical (ring)", true, [node](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_hierarchical(c, in, out, n, t, op, node, HIER_INTER_RING); }, all_of},
        {"allreduce_hierarchical (recursive doubling)", true, [node](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_hierarchical(c, in, out, n, t, op, node, HIER_INTER_RECURSIVE_DOUBLING); }, all_of},
        {"allreduce_hierarchical_leader (ring)", true, [node](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_hierarchical_leader(c, in, out, n, t, op, node, HIER_INTER_RING); }, all_of},
        {"allreduce_hierarchical_leader (recursive doubling) in place", true, [node](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            comm_copy(c, out, in, n, t); allreduce_hierarchical_leader(c, out, out, n, t, op, node, HIER_INTER_RECURSIVE_DOUBLING); }, all_of},
        {"allreduce_torus2d", true, [rows](Comm* c, void* in, void* out, size_t n, CommType t, CommOp op) {
            allreduce_torus2d(c, in, out, n, t, op, rows, c->size / rows); }, all_of},
    };
    return v;
}

// Random values (every bit depends on the order of the additions): the device path must give
// the host path's result bit for bit. And it takes no host scratch: comm_host_scratch_count
// stays put over every device call (a local reduce done on the host would move it as well).
static void test_algorithms_vs_host(Comm* d, Comm* h) {
    int p = d->size;
    long cases = 0, failed = 0, host_scratch = 0;
    std::vector<AlgoCase> algos = algo_cases(p);
    std::vector<std::string> bad;
    for (CommType t : TYPES) {
        size_t es = comm_type_size(t);
        for (size_t n : {(size_t)1, (size_t)(3 * p + 1), (size_t)1009}) {
            size_t elems = (n + 3) * (size_t)p, bytes = elems * es;   // room for all-to-all(v)
            std::vector<char> in(bytes), host(bytes), got(bytes);
            void *din = NULL, *dout = NULL;
            check(d, "cudaMalloc", cudaMalloc(&din, bytes));
            check(d, "cudaMalloc", cudaMalloc(&dout, bytes));
            for (size_t a = 0; a < algos.size(); a++) {
                for (CommOp op : OPS) {
                    if (!algos[a].reduces && op != COMM_SUM) { continue; }
                    fill_random(in.data(), elems, t, d->rank, 100 + (int)a * 4 + (int)op);
                    std::fill(host.begin(), host.end(), 0);
                    algos[a].run(h, in.data(), host.data(), n, t, op);
                    check(d, "cudaMemcpy", cudaMemcpy(din, in.data(), bytes, cudaMemcpyHostToDevice));
                    check(d, "cudaMemset", cudaMemset(dout, 0, bytes));
                    inputs_ready(d);
                    uint64_t before = comm_host_scratch_count();
                    algos[a].run(d, din, dout, n, t, op);
                    host_scratch += comm_host_scratch_count() != before;
                    check(d, "cudaMemcpy", cudaMemcpy(got.data(), dout, bytes, cudaMemcpyDeviceToHost));
                    std::pair<size_t, size_t> s = algos[a].span(d, n);
                    cases++;
                    if (s.second > s.first && memcmp(got.data() + s.first * es, host.data() + s.first * es, (s.second - s.first) * es) != 0) {
                        failed++;
                        if (bad.size() < 4) { bad.push_back(std::string(algos[a].name) + " " + comm_type_name(t) + " " + comm_op_name(op) + " n=" + std::to_string(n)); }
                    }
                }
            }
            cudaFree(din);
            cudaFree(dout);
        }
    }
    for (const std::string& b : bad) { printf("  rank %d: differs: %s\n", d->rank, b.c_str()); }
    report(d, "every educational algorithm (" + std::to_string(algos.size()) + ", in place where it has a scratch path): device buffers = host buffers bit for bit", cases, failed);
    report(d, "no host scratch for device buffers (comm_host_scratch_count unchanged by every device call)", cases, host_scratch);
}

// comm_scratch: device memory on a device communicator, host memory on a host one; and a
// collective repeated as a layer loop would call it allocates nothing after the first layer
static void test_scratch(Comm* d, Comm* h) {
    long failed = 0;
    void* a = comm_scratch(d, 1000, COMM_FP32);
    void* b = comm_scratch(h, 1000, COMM_FP32);
    failed += !comm_is_device_ptr(a);
    failed += comm_is_device_ptr(b);
    comm_scratch_free(d, a);
    comm_scratch_free(h, b);
    int p = d->size;
    size_t n = 4097;
    void *x = NULL, *y = NULL;
    check(d, "cudaMalloc", cudaMalloc(&x, n * p * 4));
    check(d, "cudaMalloc", cudaMalloc(&y, n * p * 4));
    check(d, "cudaMemset", cudaMemset(x, 0, n * p * 4));
    inputs_ready(d);
    uint64_t first = 0, host_before = comm_host_scratch_count();
    const int layers = 8;
    for (int l = 0; l < layers; l++) {
        allreduce_ring(d, x, x, n, COMM_BF16, COMM_SUM);                                // scratch: one block
        reduce_scatter_ring(d, x, comm_at(y, comm_block_offset(n, p, d->rank), COMM_FP32), n, COMM_FP32, COMM_AVG);   // two blocks
        allreduce_recursive_doubling(d, x, y, n, COMM_FP32, COMM_MAX);                  // the whole buffer
        alltoall_bruck(d, x, x, n, COMM_INT32);                                         // three at once
        if (l == 0) { first = d->scratch_mallocs; }
    }
    failed += d->scratch_mallocs != first;
    failed += comm_host_scratch_count() != host_before;
    cudaFree(x);
    cudaFree(y);
    char name[256];
    snprintf(name, sizeof(name), "device scratch: device memory (host on a host communicator); %d layers of 4 collectives: "
             "%llu cudaMalloc in the first, %llu after", layers, (unsigned long long)first,
             (unsigned long long)(d->scratch_mallocs - first));
    report(d, name, 2 + layers * 4, failed);
}

// --- events: a compute kernel before a collective

__global__ void fill_kernel(float* p, size_t n, float v, long long spin) {
#ifndef LLMC_EMU
    long long t0 = clock64();   // slow, so that a collective not ordered after it would read too early
    while (clock64() - t0 < spin) {}
#else
    (void)spin;
#endif
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        p[i] = v + (float)(i % 7);
    }
}

// a kernel on the compute stream writes in; then [record + comm_wait_event]; then an
// all-reduce (sum) of in into out on c. Returns how many elements differ from the sum of the
// kernel's values, and in *stale how many equal the sum of the old values (written with v = -1).
static long event_case(Comm* c, bool ring, bool wait, long* stale) {
    size_t n = (1u << 16) + 3;
    float *in = NULL, *out = NULL;
    check(c, "cudaMalloc", cudaMalloc(&in, n * 4));
    check(c, "cudaMalloc", cudaMalloc(&out, n * 4));
    fill_kernel<<<comm_dev_grid(n), 256>>>(in, n, -1.0f, 0);
    check(c, "cudaMemset", cudaMemset(out, 0, n * 4));
    check(c, "cudaDeviceSynchronize", cudaDeviceSynchronize());   // the old values are in place
    fill_kernel<<<comm_dev_grid(n), 256>>>(in, n, (float)(c->rank + 1), 20 * 1000 * 1000);
    check(c, "fill_kernel", cudaGetLastError());
    static BackendEvent e = backend_event_create();
    if (wait) {
        backend_event_record(e);
        comm_wait_event(c, e);
    }
    if (ring) { allreduce_ring(c, in, out, n, COMM_FP32, COMM_SUM); }
    else { allreduce_native(c, in, out, n, COMM_FP32, COMM_SUM); }
    std::vector<float> got(n);
    check(c, "cudaMemcpy", cudaMemcpy(got.data(), out, n * 4, cudaMemcpyDeviceToHost));
    int p = c->size;
    long wrong = 0;
    *stale = 0;
    for (size_t i = 0; i < n; i++) {
        float want = (float)(p * (p + 1) / 2) + (float)(p * (int)(i % 7));
        wrong += got[i] != want;
        *stale += got[i] == (float)(p * (-1 + (int)(i % 7)));
    }
    cudaFree(in);
    cudaFree(out);
    return wrong;
}

static void test_events(Comm* world, int staged) {
    Comm nb = comm_split(world, 0, world->rank, "events-nonblocking");
    comm_enable_device(&nb, staged, 1);
    Comm bl = comm_split(world, 0, world->rank, "events-blocking");
    comm_enable_device(&bl, staged, 0);
    long stale = 0, failed = 0, failed_blocking = 0;
    for (int ring = 0; ring < 2; ring++) {
        failed += event_case(&nb, ring, true, &stale) != 0;
        failed_blocking += event_case(&bl, ring, false, &stale) != 0;
    }
    report(&nb, "events: kernel on the compute stream, backend_event_record + comm_wait_event, all-reduce (native, ring) "
           "on a non-blocking stream: the kernel's data", 2, failed);
    report(&bl, "events: a blocking stream needs no event: CUDA orders it after the compute stream", 2, failed_blocking);
#ifdef LLMC_EMU
    // the emulator runs the kernel only when something waits for it: without the event nothing does
    long missed = 0;
    for (int ring = 0; ring < 2; ring++) {
        event_case(&nb, ring, false, &stale);
        missed += stale != (1 << 16) + 3;
    }
    report(&nb, "events (emulator): without comm_wait_event the all-reduce reads the old data (the check above can fail)",
           2, missed);
#endif
    comm_free(&nb);
    comm_free(&bl);
}

int main(int argc, char** argv) {
    Comm world = comm_init_world(&argc, &argv);
    comm_select_device(&world);
    for (int staged = 0; staged < 2; staged++) {
        bool skipped = false;
        for (int nonblocking = 0; nonblocking < 2 && !skipped; nonblocking++) {
            Comm c = comm_split(&world, 0, world.rank, staged ? "device-staged" : "device");
            comm_enable_device(&c, staged, nonblocking);
            if (!staged && c.staged) {
                // no NCCL here: the ranks share a GPU (always so under the CPU emulator), so this pass
                // would repeat the staged one below
                if (c.rank == 0) {
                    printf("SKIP nccl wire p=%d: the ranks share a GPU%s, so comm_enable_device picked the staged wire "
                           "(tested below); NCCL needs one GPU per rank\n", c.size,
#ifdef LLMC_EMU
                           " (CPU emulator)"
#else
                           ""
#endif
                    );
                    fflush(stdout);
                }
                comm_free(&c);
                skipped = true;
                continue;
            }
            test_allreduce(&c);
            test_movement(&c);
            test_vs_host(&c, &world);
            test_algorithms_vs_host(&c, &world);
            if (!nonblocking) { test_scratch(&c, &world); }
            barrier_native(&c);
            comm_free(&c);
        }
        if (!skipped) { test_events(&world, staged); }
    }
    comm_free(&world);
    comm_finalize();
    return failures == 0 ? 0 : 1;
}
#endif
