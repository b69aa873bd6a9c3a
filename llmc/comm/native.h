// The native collectives: one function per primitive, each a thin wrapper around the MPI
// collective (native_mpi.h) or, on a device communicator, the NCCL one (native_nccl.h). They are
// the default fast path and the reference every educational algorithm is tested against. MPI
// and NCCL pick their own algorithms inside, so these calls add nothing to the communicator's counters (only
// transport.h counts).
//
// Signature style, shared with ring.h, tree.h and recursive.h:
//   broadcast_X      (comm, buf, count, type, root)
//   reduce_X         (comm, send, recv, count, type, op, root)   recv written at the root only
//   allreduce_X      (comm, send, recv, count, type, op)
//   reduce_scatter_X (comm, send, recv, count, type, op)         count = full size; rank r gets block r
//   allgather_X      (comm, send, recv, count, type)             count = full size; rank r gives block r
//   gather_X         (comm, send, recv, count, type, root)       like allgather, result at the root
//   scatter_X        (comm, send, recv, count, type, root)       the root's full buffer, block r to rank r
//   alltoall_X       (comm, send, recv, count, type)             count elements per pair of ranks
// Blocks follow the balanced split of comm.h. In place: send == recv for reduce, all-reduce
// and all-to-all; the own block of the full buffer for the others (allgather: send == recv +
// offset(rank); reduce_scatter: recv == send + offset(rank); gather at the root: send == recv +
// offset(root); scatter at the root: recv == send + offset(root)).
//
// Host communicators take host buffers: each function checks its arguments, then makes its MPI
// call (native_mpi.h: bf16, which MPI has no type for, is reduced in fp32 and rounded once;
// avg is MPI's sum followed by comm_avg_finish).
// Device communicators (CUDA build, comm.h's "The device path") take device buffers; each
// function checks its arguments as above, then hands over to its *_device twin in
// native_nccl.h: nccl* on the NCCL wire (ncclBroadcast, ncclReduce, ncclAllReduce,
// ncclReduceScatter, ncclAllGather; gather, scatter and all-to-all(v) as grouped
// ncclSend/ncclRecv, which NCCL has no primitive for), or MPI on host copies on the staged wire.
// The arithmetic is the MPI path's: bf16 reductions widen to fp32 on the GPU and round once at
// the end, and avg is a sum followed by comm_avg_finish's division, so host and device agree
// bit for bit.
#pragma once

#include "comm.h"
#include "native_mpi.h"
#ifdef LLMC_CUDA_COMM
#include "native_nccl.h"
#define NATIVE_TO_DEVICE(call) if (c->device) { call; return; }
#else
#define NATIVE_TO_DEVICE(call)
#endif

static inline void broadcast_native(Comm* c, void* buf, size_t count, CommType t, int root) {
    comm_check_root(c, "broadcast_native", root);
    comm_check_args(c, "broadcast_native", count, t, COMM_SUM, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(broadcast_device(c, buf, count, t, root))
    broadcast_mpi(c, buf, count, t, root);
}

static inline void reduce_native(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op, int root) {
    comm_check_root(c, "reduce_native", root);
    comm_check_args(c, "reduce_native", count, t, op, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(reduce_device(c, send, recv, count, t, op, root))
    reduce_mpi(c, send, recv, count, t, op, root);
}

static inline void allreduce_native(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "allreduce_native", count, t, op, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(allreduce_device(c, send, recv, count, t, op))
    allreduce_mpi(c, send, recv, count, t, op);
}

static inline void reduce_scatter_native(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "reduce_scatter_native", count, t, op, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(reduce_scatter_device(c, send, recv, count, t, op))
    reduce_scatter_mpi(c, send, recv, count, t, op);
}

static inline void allgather_native(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "allgather_native", count, t, COMM_SUM, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(allgather_device(c, send, recv, count, t))
    allgather_mpi(c, send, recv, count, t);
}

static inline void gather_native(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
    comm_check_root(c, "gather_native", root);
    comm_check_args(c, "gather_native", count, t, COMM_SUM, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(gather_device(c, send, recv, count, t, root))
    gather_mpi(c, send, recv, count, t, root);
}

static inline void scatter_native(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
    comm_check_root(c, "scatter_native", root);
    comm_check_args(c, "scatter_native", count, t, COMM_SUM, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(scatter_device(c, send, recv, count, t, root))
    scatter_mpi(c, send, recv, count, t, root);
}

// rank r's send block j (count elements at j * count) lands in rank j's recv block r
static inline void alltoall_native(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "alltoall_native", count, t, COMM_SUM, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(alltoall_device(c, send, recv, count, t))
    alltoall_mpi(c, send, recv, count, t);
}

// Per-peer counts and element offsets (MoE's token exchange): rank r sends sendcounts[j]
// elements from send + sdispls[j] to rank j, which receives them at recv + rdispls[r] and must
// expect recvcounts[r] == that count. Out of place only.
static inline void alltoallv_native(Comm* c, const void* send, const size_t* sendcounts, const size_t* sdispls,
                                    void* recv, const size_t* recvcounts, const size_t* rdispls, CommType t) {
    if (send == recv) { comm_die(c, "alltoallv_native", "send and recv must be different buffers"); }
    NATIVE_TO_DEVICE(alltoallv_device(c, send, sendcounts, sdispls, recv, recvcounts, rdispls, t))
    alltoallv_mpi(c, send, sendcounts, sdispls, recv, recvcounts, rdispls, t);
}

static inline void barrier_native(Comm* c) {
#ifdef LLMC_CUDA_COMM
    if (c->device) { comm_sync(c, "barrier_native"); }   // this rank's device work is done, then the ranks meet
#endif
    MPI_Barrier(c->mpi);
}
