// The device path of llmc/comm/ (CUDA build): native and ring collectives on device buffers,
// over both wires (NCCL, and staged MPI through host copies), bit for bit against the result
// computed locally on the host, and the ring's counted bytes against its formula; then, on
// random (order-sensitive) values, every collective on device buffers bit for bit against the
// same call on host buffers over a host communicator (MPI itself for the native ones).
//
// Needs one GPU per rank for the NCCL wire: when ranks share a GPU, comm_enable_device falls
// back to the staged wire, and the NCCL pass prints a SKIP line (not counted as PASS) instead
// of repeating the staged one. Built by scripts/nvcc_check.sh with nvcc, NCCL and MPI, and by
// `make build/emu/test_collectives_device` for the CPU emulator (dev/emu/: every emulated rank
// shares the one emulated GPU, so only the staged wire runs; test/test_emu_collectives.sh):
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

int main(int argc, char** argv) {
    Comm world = comm_init_world(&argc, &argv);
    comm_select_device(&world);
    for (int staged = 0; staged < 2; staged++) {
        Comm c = comm_split(&world, 0, world.rank, staged ? "device-staged" : "device");
        comm_enable_device(&c, staged);
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
            continue;
        }
        test_allreduce(&c);
        test_movement(&c);
        test_vs_host(&c, &world);
        barrier_native(&c);
        comm_free(&c);
    }
    comm_free(&world);
    comm_finalize();
    return failures == 0 ? 0 : 1;
}
#endif
