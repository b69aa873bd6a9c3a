// The device path of llmc/comm/ (CUDA build): native and ring collectives on device buffers,
// over both wires (NCCL, and staged MPI through host copies), bit for bit against the result
// computed locally on the host, and the ring's counted bytes against its formula.
//
// Needs one GPU per rank for the NCCL wire (ranks sharing a GPU fall back to the staged wire,
// which is what comm_enable_device detects). Built by scripts/nvcc_check.sh with nvcc, NCCL and
// MPI; never run in CI, which has no GPU:
//   mpirun -np 2 ./test_collectives_device      one PASS/FAIL line per group and wire
#ifdef LLMC_CPU
#include <stdio.h>
int main() {
    printf("test_collectives_device: the CPU build has no device path, nothing to test\n");
    return 0;
}
#else
#include <string>
#include <vector>
#include "../llmc/comm/native.h"
#include "../llmc/comm/ring.h"

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
        printf("%s %s %s p=%d (%ld cases)\n", failed == 0 ? "PASS" : "FAIL", name.c_str(), c->staged ? "staged" : "nccl",
               c->size, cases);
        fflush(stdout);
    }
    failures += failed > 0;
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
            broadcast_native(c, b.d, n, t, p - 1);
            std::vector<char> want(n * es + 1);
            for (size_t i = 0; i < n; i++) { store(want.data(), i, t, value(p - 1, i)); }
            cases++;
            failed += memcmp(b.to_host().data(), want.data(), n * es) != 0;
            // all-gather: block r of rank r's input
            DevBuf g(c, n, t, c->rank), full(c, n, t, c->rank);
            size_t off = comm_block_offset(n, p, c->rank);
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

int main(int argc, char** argv) {
    Comm world = comm_init_world(&argc, &argv);
    comm_select_device(&world);
    for (int staged = 0; staged < 2; staged++) {
        Comm c = comm_split(&world, 0, world.rank, staged ? "device-staged" : "device");
        comm_enable_device(&c, staged);
        test_allreduce(&c);
        test_movement(&c);
        barrier_native(&c);
        comm_free(&c);
    }
    comm_free(&world);
    comm_finalize();
    return failures == 0 ? 0 : 1;
}
#endif
