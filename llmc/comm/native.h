// The native collectives: one function per primitive, each a thin wrapper around the MPI
// collective. They are the default fast path and the reference every educational algorithm
// is tested against. MPI picks its own algorithm inside, so these calls add nothing to the
// communicator's counters (only transport.h counts).
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
// bf16 has no MPI type: data movement sends it as uint16; a reduction widens it to fp32,
// reduces in fp32 and rounds back once. avg is MPI's sum followed by comm_avg_finish.
//
// Device communicators (CUDA build, comm.h's "The device path") take device buffers; each
// function checks its arguments as above, then hands over to its *_device twin in
// native_nccl.h: nccl* on the NCCL wire (ncclBroadcast, ncclReduce, ncclAllReduce,
// ncclReduceScatter, ncclAllGather; gather, scatter and all-to-all(v) as grouped
// ncclSend/ncclRecv, which NCCL has no primitive for), or MPI on host copies on the staged wire.
// The arithmetic is the host path's: bf16 reductions widen to fp32 on the GPU and round once at
// the end, and avg is a sum followed by comm_avg_finish's division, so host and device agree
// bit for bit. The host versions below run on host buffers only (host communicators, and the
// staged wire's host copies), so their scratch (comm_scratch(c, ...)) is host memory.
#pragma once

#include <algorithm>
#include <vector>
#include "comm.h"

#ifdef LLMC_CUDA_COMM
static inline void broadcast_device(Comm* c, void* buf, size_t count, CommType t, int root);
static inline void reduce_device(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op, int root);
static inline void allreduce_device(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op);
static inline void reduce_scatter_device(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op);
static inline void allgather_device(Comm* c, const void* send, void* recv, size_t count, CommType t);
static inline void gather_device(Comm* c, const void* send, void* recv, size_t count, CommType t, int root);
static inline void scatter_device(Comm* c, const void* send, void* recv, size_t count, CommType t, int root);
static inline void alltoall_device(Comm* c, const void* send, void* recv, size_t count, CommType t);
static inline void alltoallv_device(Comm* c, const void* send, const size_t* sendcounts, const size_t* sdispls,
                                    void* recv, const size_t* recvcounts, const size_t* rdispls, CommType t);
#define NATIVE_TO_DEVICE(call) if (c->device) { call; return; }
#else
#define NATIVE_TO_DEVICE(call)
#endif

static inline MPI_Datatype comm_mpi_type(CommType t) {
    if (t == COMM_FP32) { return MPI_FLOAT; }
    if (t == COMM_INT32) { return MPI_INT32_T; }
    return MPI_UINT16_T;
}
static inline MPI_Op comm_mpi_op(CommOp op) {
    if (op == COMM_MAX) { return MPI_MAX; }
    if (op == COMM_MIN) { return MPI_MIN; }
    return MPI_SUM;   // sum and avg
}

static inline float* native_widen(Comm* c, const void* src, size_t n) {
    float* w = (float*)comm_scratch(c, n, COMM_FP32);
    const uint16_t* s = (const uint16_t*)src;
    for (size_t i = 0; i < n; i++) { w[i] = bf16_to_float(s[i]); }
    return w;
}
static inline void native_narrow(void* dst, const float* w, size_t n) {
    uint16_t* d = (uint16_t*)dst;
    for (size_t i = 0; i < n; i++) { d[i] = float_to_bf16(w[i]); }
}

// per-rank counts and displacements of the balanced split, as MPI's int arrays
static inline void native_blocks(const Comm* c, const char* call, size_t count, std::vector<int>* counts, std::vector<int>* displs) {
    counts->resize(c->size);
    displs->resize(c->size);
    for (int r = 0; r < c->size; r++) {
        (*counts)[r] = comm_int_count(c, call, comm_block_count(count, c->size, r));
        (*displs)[r] = comm_int_count(c, call, comm_block_offset(count, c->size, r));
    }
}

static inline void broadcast_native(Comm* c, void* buf, size_t count, CommType t, int root) {
    comm_check_root(c, "broadcast_native", root);
    comm_check_args(c, "broadcast_native", count, t, COMM_SUM, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(broadcast_device(c, buf, count, t, root))
    MPI_Bcast(buf, comm_int_count(c, "broadcast_native", count), comm_mpi_type(t), root, c->mpi);
}

static inline void reduce_native(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op, int root) {
    comm_check_root(c, "reduce_native", root);
    comm_check_args(c, "reduce_native", count, t, op, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(reduce_device(c, send, recv, count, t, op, root))
    int n = comm_int_count(c, "reduce_native", count);
    bool at_root = c->rank == root;
    if (t == COMM_BF16) {
        float* w = native_widen(c, send, count);
        MPI_Reduce(at_root ? MPI_IN_PLACE : w, w, n, MPI_FLOAT, comm_mpi_op(op), root, c->mpi);
        if (at_root) {
            comm_avg_finish(c, w, count, COMM_FP32, op, c->size);
            native_narrow(recv, w, count);
        }
        comm_scratch_free(c, w);
        return;
    }
    const void* s = (at_root && send == recv) ? MPI_IN_PLACE : send;
    MPI_Reduce(s, recv, n, comm_mpi_type(t), comm_mpi_op(op), root, c->mpi);
    if (at_root) { comm_avg_finish(c, recv, count, t, op, c->size); }
}

static inline void allreduce_native(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "allreduce_native", count, t, op, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(allreduce_device(c, send, recv, count, t, op))
    int n = comm_int_count(c, "allreduce_native", count);
    if (t == COMM_BF16) {
        float* w = native_widen(c, send, count);
        MPI_Allreduce(MPI_IN_PLACE, w, n, MPI_FLOAT, comm_mpi_op(op), c->mpi);
        comm_avg_finish(c, w, count, COMM_FP32, op, c->size);
        native_narrow(recv, w, count);
        comm_scratch_free(c, w);
        return;
    }
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, comm_mpi_type(t), comm_mpi_op(op), c->mpi);
    comm_avg_finish(c, recv, count, t, op, c->size);
}

static inline void reduce_scatter_native(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "reduce_scatter_native", count, t, op, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(reduce_scatter_device(c, send, recv, count, t, op))
    std::vector<int> counts, displs;
    native_blocks(c, "reduce_scatter_native", count, &counts, &displs);
    size_t mine = comm_block_count(count, c->size, c->rank);
    // reduce in fp32 for bf16, and always into a scratch block: in place, recv lies inside send
    CommType wt = t == COMM_BF16 ? COMM_FP32 : t;
    const void* full = t == COMM_BF16 ? native_widen(c, send, count) : send;
    void* out = comm_scratch(c, mine, wt);
    if (count % c->size == 0) {
        MPI_Reduce_scatter_block(full, out, counts[0], comm_mpi_type(wt), comm_mpi_op(op), c->mpi);
    } else {
        MPI_Reduce_scatter(full, out, counts.data(), comm_mpi_type(wt), comm_mpi_op(op), c->mpi);
    }
    comm_avg_finish(c, out, mine, wt, op, c->size);
    if (t == COMM_BF16) {
        native_narrow(recv, (const float*)out, mine);
        comm_scratch_free(c, (void*)full);
    } else {
        comm_copy(c, recv, out, mine, t);
    }
    comm_scratch_free(c, out);
}

static inline void allgather_native(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "allgather_native", count, t, COMM_SUM, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(allgather_device(c, send, recv, count, t))
    std::vector<int> counts, displs;
    native_blocks(c, "allgather_native", count, &counts, &displs);
    const void* s = send == comm_at(recv, displs[c->rank], t) ? MPI_IN_PLACE : send;
    MPI_Datatype mt = comm_mpi_type(t);
    if (count % c->size == 0) {
        MPI_Allgather(s, counts[c->rank], mt, recv, counts[0], mt, c->mpi);
    } else {
        MPI_Allgatherv(s, counts[c->rank], mt, recv, counts.data(), displs.data(), mt, c->mpi);
    }
}

static inline void gather_native(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
    comm_check_root(c, "gather_native", root);
    comm_check_args(c, "gather_native", count, t, COMM_SUM, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(gather_device(c, send, recv, count, t, root))
    std::vector<int> counts, displs;
    native_blocks(c, "gather_native", count, &counts, &displs);
    bool in_place = c->rank == root && send == comm_at(recv, displs[root], t);
    const void* s = in_place ? MPI_IN_PLACE : send;
    MPI_Datatype mt = comm_mpi_type(t);
    if (count % c->size == 0) {
        MPI_Gather(s, counts[c->rank], mt, recv, counts[0], mt, root, c->mpi);
    } else {
        MPI_Gatherv(s, counts[c->rank], mt, recv, counts.data(), displs.data(), mt, root, c->mpi);
    }
}

static inline void scatter_native(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
    comm_check_root(c, "scatter_native", root);
    comm_check_args(c, "scatter_native", count, t, COMM_SUM, root);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(scatter_device(c, send, recv, count, t, root))
    std::vector<int> counts, displs;
    native_blocks(c, "scatter_native", count, &counts, &displs);
    bool in_place = c->rank == root && recv == comm_at(send, displs[root], t);
    void* r = in_place ? MPI_IN_PLACE : recv;
    MPI_Datatype mt = comm_mpi_type(t);
    if (count % c->size == 0) {
        MPI_Scatter(send, counts[0], mt, r, counts[c->rank], mt, root, c->mpi);
    } else {
        MPI_Scatterv(send, counts.data(), displs.data(), mt, r, counts[c->rank], mt, root, c->mpi);
    }
}

// rank r's send block j (count elements at j * count) lands in rank j's recv block r
static inline void alltoall_native(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "alltoall_native", count, t, COMM_SUM, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(alltoall_device(c, send, recv, count, t))
    int n = comm_int_count(c, "alltoall_native", count);
    comm_int_count(c, "alltoall_native", count * c->size);
    MPI_Alltoall(send == recv ? MPI_IN_PLACE : send, n, comm_mpi_type(t), recv, n, comm_mpi_type(t), c->mpi);
}

// Per-peer counts and element offsets (MoE's token exchange): rank r sends sendcounts[j]
// elements from send + sdispls[j] to rank j, which receives them at recv + rdispls[r] and must
// expect recvcounts[r] == that count. Out of place only.
static inline void alltoallv_native(Comm* c, const void* send, const size_t* sendcounts, const size_t* sdispls,
                                    void* recv, const size_t* recvcounts, const size_t* rdispls, CommType t) {
    if (send == recv) { comm_die(c, "alltoallv_native", "send and recv must be different buffers"); }
    NATIVE_TO_DEVICE(alltoallv_device(c, send, sendcounts, sdispls, recv, recvcounts, rdispls, t))
    std::vector<int> sc(c->size), sd(c->size), rc(c->size), rd(c->size);
    for (int j = 0; j < c->size; j++) {
        sc[j] = comm_int_count(c, "alltoallv_native", sendcounts[j]);
        sd[j] = comm_int_count(c, "alltoallv_native", sdispls[j]);
        rc[j] = comm_int_count(c, "alltoallv_native", recvcounts[j]);
        rd[j] = comm_int_count(c, "alltoallv_native", rdispls[j]);
    }
    MPI_Alltoallv(send, sc.data(), sd.data(), comm_mpi_type(t), recv, rc.data(), rd.data(), comm_mpi_type(t), c->mpi);
}

static inline void barrier_native(Comm* c) {
#ifdef LLMC_CUDA_COMM
    if (c->device) { comm_sync(c, "barrier_native"); }   // this rank's device work is done, then the ranks meet
#endif
    MPI_Barrier(c->mpi);
}


#ifdef LLMC_CUDA_COMM
#include "native_nccl.h"
#endif

