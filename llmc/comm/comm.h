// Communicators, data types, reduction ops, the local reduce, and traffic counters (the types and
// the Comm struct: comm_types.h; the local reduce's loops on host memory: reduce_local_host.h).
//
// A Comm is a plain struct around an MPI communicator: the world, or any subset of it made
// with comm_split (the dimensions of the parallel mesh later). Every transport call
// (transport.h) adds the bytes and messages it sends to its communicator's counters, so a
// test or the step line can hold the counted volume against an algorithm's formula.
//
// Types: fp32, bf16 (stored as uint16; reduced in fp32, rounded back to nearest-even) and
// int32. Ops: sum, avg (sum, then divide by the number of ranks; int32 divides with C's
// truncation toward zero), max, min.
//
// Counts. Broadcast, reduce and all-reduce take the number of elements of the buffer.
// Gather, scatter, all-gather and reduce-scatter take `count`, the number of elements of the
// FULL buffer (the gathered or the unreduced one), and split it into p blocks with the
// balanced rule of comm_block_offset/comm_block_count: the first count % p ranks own
// ceil(count / p) elements, the others floor(count / p). Rank r owns block r. So count may
// be anything, 0 and counts below p included (some blocks are then empty), and an all-reduce
// is exactly a reduce-scatter followed by an all-gather of the same count. All-to-all takes the
// count per pair of ranks. Native and educational versions follow the same rules.
//
// Host buffers travel over MPI. The device path (device buffers: NCCL, or MPI through host
// copies) is compiled only in the CUDA build, see "The device path" below; the algorithms do
// not change, they call only comm_send/comm_recv/comm_sendrecv and the helpers that take the
// communicator: comm_scratch/comm_scratch_free, comm_reduce_local, comm_copy, comm_avg_finish.
//
// The device path (CUDA build; comm_nccl.h). LLMC_CUDA_COMM is defined (comm_types.h) when nvcc
// compiles without -DLLMC_CPU; the CPU build (g++/mpicxx, or nvcc with -DLLMC_CPU) contains none of it and is
// unchanged. comm_enable_device(c) turns a communicator into a device communicator (collective
// over c): its collectives then take device buffers, and its transport moves them over one of
// two wires, chosen once for the whole communicator so that both ends of a message agree:
//   NCCL    ncclSend/ncclRecv and the nccl* collectives, on c->stream; the NCCL communicator
//           is made from an ncclUniqueId that rank 0 creates and MPI_Bcast hands to the others.
//   staged  when two ranks of c on one node use the same GPU (NCCL refuses a communicator with
//           a duplicate device), or when asked: device -> pinned host copy, MPI, host -> device.
//           Slower, but a student with one GPU can still run 4 ranks.
// Both wires count the same bytes as the host path. Every call returns when its data are in
// place (the stream is synchronised), like its MPI twin.
//
//   compute stream (legacy default)    kernel writes g ... record e ......... kernel reads g
//                                                              |                  ^
//   c->stream            comm_wait_event(c, e) -> copies, reduce kernels, NCCL -> sync (call returns)
//
// A stream per communicator: every device operation of a collective (copies, the local reduce
// and the average as kernels, NCCL) runs on c->stream, and a call synchronises that stream,
// never the whole device. Its scratch (comm_scratch) is device memory taken from a few buffers
// kept with the communicator and reused by size, so a collective called every layer does not
// cudaMalloc; comm_scratch_free gives it back. So the local reduce runs on the device on device
// data, and only the MPI message of the staged wire passes through (pinned) host memory.
// Ordering with the compute stream: c->stream is a blocking stream by default, which CUDA
// orders after everything issued before on the legacy default stream (and everything issued
// after on it waits for c->stream's earlier work): safe for any caller, but compute and
// communication do not overlap on the GPU. comm_enable_device(c, staged, 1) makes it
// non-blocking: then nothing orders it with the compute stream but events, so data the compute
// stream wrote must be announced with an event (backend_event_record) that the communicator
// waits for (comm_wait_event) before the collective. comm_wait_event takes the backend's
// BackendEvent and is a no-op on a host communicator (and in the CPU build), so host code calls
// it without an #ifdef. A device communicator expects device buffers; host buffers still work
// (copied over on c->stream). The helpers without a communicator (comm_copy, comm_reduce_local,
// comm_avg_finish on bare pointers: tests, collbench) look at the pointers and use the legacy
// stream, and only while some device communicator exists, so host-only programs make no CUDA call.
#pragma once

#include "comm_types.h"
#include "reduce_local_host.h"
#ifdef LLMC_CUDA_COMM
#include "comm_nccl.h"   // the device path: NCCL communicator, stream, wires
#endif

static inline void comm_check_root(const Comm* c, const char* call, int root) {
    if (root < 0 || root >= c->size) {
        comm_die(c, call, "root %d out of range [0, %d)", root, c->size);
    }
}

// MPI counts are int: refuse what does not fit rather than truncate it.
static inline int comm_int_count(const Comm* c, const char* call, size_t n) {
    if (n > (size_t)INT32_MAX) {
        comm_die(c, call, "%zu elements/bytes exceed MPI's int count limit", n);
    }
    return (int)n;
}

// Every rank must pass the same arguments to a collective; a mismatch would otherwise hang or
// silently corrupt data. With check_args on, compare them across ranks (min == max).
static inline void comm_check_args(const Comm* c, const char* call, size_t count, CommType t, CommOp op, int root) {
    if (!c->check_args || c->size == 1) { return; }
    long long mine[4] = {(long long)count, (long long)t, (long long)op, (long long)root};
    long long lo[4], hi[4];
    MPI_Allreduce(mine, lo, 4, MPI_LONG_LONG, MPI_MIN, c->mpi);
    MPI_Allreduce(mine, hi, 4, MPI_LONG_LONG, MPI_MAX, c->mpi);
    const char* what[4] = {"count", "type", "op", "root"};
    for (int i = 0; i < 4; i++) {
        if (lo[i] != hi[i]) {
            comm_die(c, call, "ranks disagree on the %s (this rank passed %lld, values range from %lld to %lld)",
                     what[i], mine[i], lo[i], hi[i]);
        }
    }
}

// --- communicators

static inline Comm comm_from_mpi(MPI_Comm mpi, const char* name) {
    Comm c;
    memset(&c, 0, sizeof(c));
    c.mpi = mpi;
    MPI_Comm_rank(mpi, &c.rank);
    MPI_Comm_size(mpi, &c.size);
    MPI_Comm_rank(MPI_COMM_WORLD, &c.world_rank);
    snprintf(c.name, sizeof(c.name), "%s", name);
    c.check_args = 1;
    return c;
}

// Initialises MPI (once per process) and returns the world communicator.
static inline Comm comm_init_world(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) { MPI_Init(argc, argv); }
    // line-buffered stderr: die() writes a line in pieces, and ranks dying at once would interleave them
    setvbuf(stderr, NULL, _IOLBF, 0);
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);   // our own context: our messages never meet the user's
    return comm_from_mpi(dup, "world");
}

// Ranks of `parent` that pass the same color form one new communicator, ordered by key (ties
// by parent rank). Collective over parent: every rank of it must call.
static inline Comm comm_split(const Comm* parent, int color, int key, const char* name) {
    if (color < 0) { comm_die(parent, "comm_split", "color %d is negative", color); }
    MPI_Comm sub;
    MPI_Comm_split(parent->mpi, color, key, &sub);
#ifdef LLMC_CUDA_COMM
    Comm c = comm_from_mpi(sub, name);
    if (parent->device) { comm_enable_device(&c, parent->staged, parent->nonblocking); }   // a device parent makes device children
    return c;
#else
    return comm_from_mpi(sub, name);
#endif
}

static inline void comm_free(Comm* c) {
#ifdef LLMC_CUDA_COMM
    comm_disable_device(c);
#endif
    if (c->mpi != MPI_COMM_NULL) { MPI_Comm_free(&c->mpi); }
}

static inline void comm_finalize(void) { MPI_Finalize(); }

static inline void comm_reset_counters(Comm* c) { c->bytes_sent = 0; c->messages_sent = 0; }

// --- the balanced block split (see "Counts" above)

static inline size_t comm_block_offset(size_t count, int p, int r) {
    size_t q = count / (size_t)p, m = count % (size_t)p;
    return (size_t)r * q + ((size_t)r < m ? (size_t)r : m);
}
static inline size_t comm_block_count(size_t count, int p, int r) {
    return count / (size_t)p + ((size_t)r < count % (size_t)p ? 1 : 0);
}

// --- the local reduce: dst[i] = dst[i] op src[i], the only arithmetic the algorithms do, on
// device buffers (comm_nccl.h) or host ones (reduce_local_host.h). avg reduces as sum here;
// comm_avg_finish divides once the sum is complete.

static inline void comm_reduce_local(void* dst, const void* src, size_t n, CommType t, CommOp op) {
#ifdef LLMC_CUDA_COMM
    if (comm_reduce_local_device(dst, src, n, t, op)) { return; }
#endif
    comm_reduce_local_host(dst, src, n, t, op);
}

// avg = sum / p, the same arithmetic in every version so that results match bit for bit.
static inline void comm_avg_finish(void* buf, size_t n, CommType t, CommOp op, int p) {
    if (op != COMM_AVG || n == 0) { return; }
#ifdef LLMC_CUDA_COMM
    if (comm_avg_finish_device(buf, n, t, p)) { return; }
#endif
    comm_avg_finish_host(buf, n, t, p);
}

// --- small helpers for the algorithms

static inline char* comm_at(void* buf, size_t elem, CommType t) { return (char*)buf + elem * comm_type_size(t); }
static inline const char* comm_at(const void* buf, size_t elem, CommType t) {
    return (const char*)buf + elem * comm_type_size(t);
}
static inline void comm_copy(void* dst, const void* src, size_t n, CommType t) {
    if (dst == src || n == 0) { return; }
#ifdef LLMC_CUDA_COMM
    if (comm_copy_device(dst, src, n * comm_type_size(t))) { return; }
#endif
    memmove(dst, src, n * comm_type_size(t));
}
// Host memory for n elements, released with free(): the tests' and collbench's buffers, and the

// --- the helpers the algorithms call, with their communicator. A host communicator: host
// memory and loops, as above. A device communicator: device scratch and kernels and copies on
// c->stream (comm_nccl.h), each call returning with its work done.

// scratch for n elements: device memory on a device communicator (see "The device path")
static inline void* comm_scratch(Comm* c, size_t n, CommType t) {
#ifdef LLMC_CUDA_COMM
    if (c->device) { return comm_scratch_device(c, (n == 0 ? 1 : n) * comm_type_size(t)); }
#endif
    (void)c;
    return comm_scratch(n, t);
}
static inline void comm_scratch_free(Comm* c, void* p) {
    if (p == NULL) { return; }
#ifdef LLMC_CUDA_COMM
    if (comm_scratch_device_free(c, p)) { return; }
#endif
    (void)c;
    free(p);
}
static inline void comm_reduce_local(Comm* c, void* dst, const void* src, size_t n, CommType t, CommOp op) {
#ifdef LLMC_CUDA_COMM
    if (c->device) { comm_reduce_local_stream(c, dst, src, n, t, op); return; }
#endif
    (void)c;
    comm_reduce_local(dst, src, n, t, op);
}
static inline void comm_avg_finish(Comm* c, void* buf, size_t n, CommType t, CommOp op, int p) {
    if (op != COMM_AVG || n == 0) { return; }
#ifdef LLMC_CUDA_COMM
    if (c->device && comm_is_device_ptr(buf)) {
        comm_cuda_check(c, "comm_avg_finish_kernel", comm_avg_finish_launch(buf, n, t, p, c->stream));
        comm_sync(c, "comm_avg_finish");
        return;
    }
#endif
    (void)c;
    comm_avg_finish(buf, n, t, op, p);
}
static inline void comm_copy(Comm* c, void* dst, const void* src, size_t n, CommType t) {
    if (dst == src || n == 0) { return; }
#ifdef LLMC_CUDA_COMM
    if (c->device) { comm_copy_stream(c, dst, src, n * comm_type_size(t)); return; }
#endif
    (void)c;
    comm_copy(dst, src, n, t);
}

#ifndef LLMC_CUDA_COMM
// The device path's comm_wait_event and comm_bind_thread (comm_nccl.h), for host code that calls
// them without an #ifdef. No streams or GPUs here: nothing to do. (The CPU backend's BackendEvent
// is a pointer, always NULL.)
static inline void comm_wait_event(Comm* c, const void* event) {
    (void)c;
    (void)event;
}
static inline void comm_bind_thread(const Comm* c) { (void)c; }
#endif

