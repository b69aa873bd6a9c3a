// The native collectives on host buffers: each one MPI call (native.h checks the arguments and
// hands device communicators to native_nccl.h instead). MPI picks its own algorithm inside, so
// these calls add nothing to the communicator's counters (only transport.h counts).
//
// bf16 has no MPI type: data movement sends it as uint16; a reduction widens it to fp32,
// reduces in fp32 and rounds back once. avg is MPI's sum followed by comm_avg_finish. These run
// on host buffers only (host communicators, and the staged wire's host copies in
// native_nccl.h), so their scratch (comm_scratch(c, ...)) is host memory.
#pragma once

#include <vector>
#include "comm.h"

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

static inline void broadcast_mpi(Comm* c, void* buf, size_t count, CommType t, int root) {
    MPI_Bcast(buf, comm_int_count(c, "broadcast_native", count), comm_mpi_type(t), root, c->mpi);
}

static inline void reduce_mpi(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op, int root) {
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

static inline void allreduce_mpi(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
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

static inline void reduce_scatter_mpi(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
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

static inline void allgather_mpi(Comm* c, const void* send, void* recv, size_t count, CommType t) {
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

static inline void gather_mpi(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
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

static inline void scatter_mpi(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
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

static inline void alltoall_mpi(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    int n = comm_int_count(c, "alltoall_native", count);
    comm_int_count(c, "alltoall_native", count * c->size);
    MPI_Alltoall(send == recv ? MPI_IN_PLACE : send, n, comm_mpi_type(t), recv, n, comm_mpi_type(t), c->mpi);
}

static inline void alltoallv_mpi(Comm* c, const void* send, const size_t* sendcounts, const size_t* sdispls,
                                 void* recv, const size_t* recvcounts, const size_t* rdispls, CommType t) {
    std::vector<int> sc(c->size), sd(c->size), rc(c->size), rd(c->size);
    for (int j = 0; j < c->size; j++) {
        sc[j] = comm_int_count(c, "alltoallv_native", sendcounts[j]);
        sd[j] = comm_int_count(c, "alltoallv_native", sdispls[j]);
        rc[j] = comm_int_count(c, "alltoallv_native", recvcounts[j]);
        rd[j] = comm_int_count(c, "alltoallv_native", rdispls[j]);
    }
    MPI_Alltoallv(send, sc.data(), sd.data(), comm_mpi_type(t), recv, rc.data(), rd.data(), comm_mpi_type(t), c->mpi);
}
