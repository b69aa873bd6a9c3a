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
// function checks its arguments as above, then hands over to its *_device twin at the end of
// this file: nccl* on the NCCL wire (ncclBroadcast, ncclReduce, ncclAllReduce,
// ncclReduceScatter, ncclAllGather; gather, scatter and all-to-all(v) as grouped
// ncclSend/ncclRecv, which NCCL has no primitive for), or MPI on host copies on the staged wire.
// The arithmetic is the host path's: bf16 reductions widen to fp32 on the GPU and round once at
// the end, and avg is a sum followed by comm_avg_finish's division, so host and device agree
// bit for bit.
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

static inline float* native_widen(const void* src, size_t n) {
    float* w = (float*)comm_scratch(n, COMM_FP32);
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
        float* w = native_widen(send, count);
        MPI_Reduce(at_root ? MPI_IN_PLACE : w, w, n, MPI_FLOAT, comm_mpi_op(op), root, c->mpi);
        if (at_root) {
            comm_avg_finish(w, count, COMM_FP32, op, c->size);
            native_narrow(recv, w, count);
        }
        free(w);
        return;
    }
    const void* s = (at_root && send == recv) ? MPI_IN_PLACE : send;
    MPI_Reduce(s, recv, n, comm_mpi_type(t), comm_mpi_op(op), root, c->mpi);
    if (at_root) { comm_avg_finish(recv, count, t, op, c->size); }
}

static inline void allreduce_native(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    comm_check_args(c, "allreduce_native", count, t, op, 0);
    if (count == 0) { return; }
    NATIVE_TO_DEVICE(allreduce_device(c, send, recv, count, t, op))
    int n = comm_int_count(c, "allreduce_native", count);
    if (t == COMM_BF16) {
        float* w = native_widen(send, count);
        MPI_Allreduce(MPI_IN_PLACE, w, n, MPI_FLOAT, comm_mpi_op(op), c->mpi);
        comm_avg_finish(w, count, COMM_FP32, op, c->size);
        native_narrow(recv, w, count);
        free(w);
        return;
    }
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, comm_mpi_type(t), comm_mpi_op(op), c->mpi);
    comm_avg_finish(recv, count, t, op, c->size);
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
    const void* full = t == COMM_BF16 ? native_widen(send, count) : send;
    void* out = comm_scratch(mine, wt);
    if (count % c->size == 0) {
        MPI_Reduce_scatter_block(full, out, counts[0], comm_mpi_type(wt), comm_mpi_op(op), c->mpi);
    } else {
        MPI_Reduce_scatter(full, out, counts.data(), comm_mpi_type(wt), comm_mpi_op(op), c->mpi);
    }
    comm_avg_finish(out, mine, wt, op, c->size);
    if (t == COMM_BF16) {
        native_narrow(recv, (const float*)out, mine);
        free((void*)full);
    } else {
        comm_copy(recv, out, mine, t);
    }
    free(out);
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
// --- the native collectives on device communicators (CUDA build only)

// Staged wire: run the host version on host copies, the communicator acting as a host one
// for the call (its arguments were checked already by the caller).
struct NativeAsHost {
    Comm* c;
    int device, check_args;
    explicit NativeAsHost(Comm* cc) : c(cc), device(cc->device), check_args(cc->check_args) {
        c->device = 0;
        c->check_args = 0;
    }
    ~NativeAsHost() {
        c->device = device;
        c->check_args = check_args;
    }
};
// A host view of a buffer: the buffer itself if it is host memory (or empty), else a host copy,
// filled from the device when `in`, written back by back().
struct NativeHostCopy {
    Comm* c;
    void* orig;
    void* host;
    size_t bytes;
    bool owned;
    NativeHostCopy(Comm* cc, const void* p, size_t n, bool in) : c(cc), orig((void*)p), host((void*)p), bytes(n), owned(false) {
        if (n == 0 || !comm_is_device_ptr(p)) { return; }
        host = malloc(n);
        if (host == NULL) { comm_die(c, "native staged copy", "out of host memory (%zu bytes)", n); }
        owned = true;
        if (in) { comm_cuda_check(c, "cudaMemcpy", cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost)); }
    }
    void back() {
        if (owned) { comm_cuda_check(c, "cudaMemcpy", cudaMemcpy(orig, host, bytes, cudaMemcpyHostToDevice)); }
    }
    ~NativeHostCopy() {
        if (owned) { free(host); }
    }
    NativeHostCopy(const NativeHostCopy&) = delete;
    NativeHostCopy& operator=(const NativeHostCopy&) = delete;
};

static inline void native_need_device(const Comm* c, const char* call, const char* what, const void* p) {
    if (!comm_is_device_ptr(p)) {
        comm_die(c, call, "%s is not device memory (a device communicator's collectives take device buffers)", what);
    }
}
static inline void native_avg(Comm* c, void* buf, size_t n, CommType t, CommOp op) {
    if (op != COMM_AVG) { return; }
    comm_cuda_check(c, "comm_avg_finish_kernel", comm_avg_finish_launch(buf, n, t, c->size, c->stream));
}
static inline float* native_widen_device(Comm* c, int slot, const void* src, size_t n) {
    float* w = (float*)comm_dev_stage(c, slot, n * sizeof(float));
    comm_cuda_check(c, "comm_bf16_widen_kernel", comm_bf16_widen_launch(w, src, n, c->stream));
    return w;
}
static inline void native_narrow_device(Comm* c, void* dst, const float* w, size_t n) {
    comm_cuda_check(c, "comm_bf16_narrow_kernel", comm_bf16_narrow_launch(dst, w, n, c->stream));
}
static inline void native_copy_async(Comm* c, void* dst, const void* src, size_t bytes) {
    if (dst == src || bytes == 0) { return; }
    comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static inline void broadcast_device(Comm* c, void* buf, size_t count, CommType t, int root) {
    size_t bytes = count * comm_type_size(t);
    if (c->staged) {
        NativeHostCopy b(c, buf, bytes, true);
        { NativeAsHost h(c); broadcast_native(c, b.host, count, t, root); }
        b.back();
        return;
    }
    native_need_device(c, "broadcast_native", "buf", buf);
    comm_nccl_check(c, "ncclBroadcast", ncclBroadcast(buf, buf, count, comm_nccl_type(t), root, c->nccl, c->stream));
    comm_sync(c, "broadcast_native");
}

static inline void reduce_device(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op, int root) {
    size_t bytes = count * comm_type_size(t);
    bool at_root = c->rank == root;
    if (c->staged) {
        NativeHostCopy s(c, send, bytes, true), r(c, recv, at_root ? bytes : 0, false);
        { NativeAsHost h(c); reduce_native(c, s.host, r.host, count, t, op, root); }
        r.back();
        return;
    }
    native_need_device(c, "reduce_native", "send", send);
    if (at_root) { native_need_device(c, "reduce_native", "recv", recv); }
    if (t == COMM_BF16) {
        float* w = native_widen_device(c, 0, send, count);
        comm_nccl_check(c, "ncclReduce", ncclReduce(w, w, count, ncclFloat32, comm_nccl_op(op), root, c->nccl, c->stream));
        if (at_root) {
            native_avg(c, w, count, COMM_FP32, op);
            native_narrow_device(c, recv, w, count);
        }
    } else {
        // recvbuff is ignored on the other ranks
        void* r = at_root ? recv : (void*)send;
        comm_nccl_check(c, "ncclReduce", ncclReduce(send, r, count, comm_nccl_type(t), comm_nccl_op(op), root, c->nccl, c->stream));
        if (at_root) { native_avg(c, recv, count, t, op); }
    }
    comm_sync(c, "reduce_native");
}

static inline void allreduce_device(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    size_t bytes = count * comm_type_size(t);
    if (c->staged) {
        NativeHostCopy s(c, send, bytes, true), r(c, recv, bytes, false);
        { NativeAsHost h(c); allreduce_native(c, s.host, r.host, count, t, op); }
        r.back();
        return;
    }
    native_need_device(c, "allreduce_native", "send", send);
    native_need_device(c, "allreduce_native", "recv", recv);
    if (t == COMM_BF16) {
        float* w = native_widen_device(c, 0, send, count);
        comm_nccl_check(c, "ncclAllReduce", ncclAllReduce(w, w, count, ncclFloat32, comm_nccl_op(op), c->nccl, c->stream));
        native_avg(c, w, count, COMM_FP32, op);
        native_narrow_device(c, recv, w, count);
    } else {
        comm_nccl_check(c, "ncclAllReduce", ncclAllReduce(send, recv, count, comm_nccl_type(t), comm_nccl_op(op), c->nccl, c->stream));
        native_avg(c, recv, count, t, op);
    }
    comm_sync(c, "allreduce_native");
}

// ncclReduceScatter needs equal blocks; with uneven ones each block is an ncclReduce to its
// owner, all in one group. In place (out == full + offset(rank)) suits both.
static inline void native_nccl_reduce_scatter(Comm* c, const void* full, void* out, size_t count, CommType t, CommOp op) {
    int p = c->size;
    ncclDataType_t nt = comm_nccl_type(t);
    if (count % (size_t)p == 0) {
        comm_nccl_check(c, "ncclReduceScatter", ncclReduceScatter(full, out, count / p, nt, comm_nccl_op(op), c->nccl, c->stream));
        return;
    }
    comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
    for (int j = 0; j < p; j++) {
        size_t n = comm_block_count(count, p, j);
        if (n == 0) { continue; }
        const void* blk = comm_at(full, comm_block_offset(count, p, j), t);
        comm_nccl_check(c, "ncclReduce", ncclReduce(blk, j == c->rank ? out : (void*)blk, n, nt, comm_nccl_op(op), j, c->nccl, c->stream));
    }
    comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
}

static inline void reduce_scatter_device(Comm* c, const void* send, void* recv, size_t count, CommType t, CommOp op) {
    size_t mine = comm_block_count(count, c->size, c->rank), es = comm_type_size(t);
    if (c->staged) {
        NativeHostCopy s(c, send, count * es, true), r(c, recv, mine * es, false);
        { NativeAsHost h(c); reduce_scatter_native(c, s.host, r.host, count, t, op); }
        r.back();
        return;
    }
    native_need_device(c, "reduce_scatter_native", "send", send);
    if (mine > 0) { native_need_device(c, "reduce_scatter_native", "recv", recv); }
    if (t == COMM_BF16) {
        float* w = native_widen_device(c, 0, send, count);
        float* out = w + comm_block_offset(count, c->size, c->rank);   // in place in the fp32 copy
        native_nccl_reduce_scatter(c, w, out, count, COMM_FP32, op);
        native_avg(c, out, mine, COMM_FP32, op);
        native_narrow_device(c, recv, out, mine);
    } else {
        native_nccl_reduce_scatter(c, send, recv, count, t, op);
        native_avg(c, recv, mine, t, op);
    }
    comm_sync(c, "reduce_scatter_native");
}

// ncclAllGather needs equal blocks; with uneven ones each block is an ncclBroadcast from its
// owner, all in one group.
static inline void allgather_device(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    int p = c->size, r = c->rank;
    size_t es = comm_type_size(t);
    if (c->staged) {
        NativeHostCopy s(c, send, comm_block_count(count, p, r) * es, true), o(c, recv, count * es, false);
        { NativeAsHost h(c); allgather_native(c, s.host, o.host, count, t); }
        o.back();
        return;
    }
    native_need_device(c, "allgather_native", "recv", recv);
    if (comm_block_count(count, p, r) > 0) { native_need_device(c, "allgather_native", "send", send); }
    ncclDataType_t nt = comm_nccl_type(t);
    if (count % (size_t)p == 0) {
        comm_nccl_check(c, "ncclAllGather", ncclAllGather(send, recv, count / p, nt, c->nccl, c->stream));
    } else {
        comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
        for (int j = 0; j < p; j++) {
            size_t n = comm_block_count(count, p, j);
            if (n == 0) { continue; }
            char* dst = comm_at(recv, comm_block_offset(count, p, j), t);
            comm_nccl_check(c, "ncclBroadcast", ncclBroadcast(j == r ? send : dst, dst, n, nt, j, c->nccl, c->stream));
        }
        comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
    }
    comm_sync(c, "allgather_native");
}

static inline void gather_device(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
    int p = c->size, r = c->rank;
    size_t es = comm_type_size(t), mine = comm_block_count(count, p, r);
    if (c->staged) {
        NativeHostCopy s(c, send, mine * es, true), o(c, recv, r == root ? count * es : 0, false);
        { NativeAsHost h(c); gather_native(c, s.host, o.host, count, t, root); }
        o.back();
        return;
    }
    if (mine > 0) { native_need_device(c, "gather_native", "send", send); }
    if (r == root) {
        native_need_device(c, "gather_native", "recv", recv);
        native_copy_async(c, comm_at(recv, comm_block_offset(count, p, r), t), send, mine * es);
    }
    ncclDataType_t nt = comm_nccl_type(t);
    comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
    if (r == root) {
        for (int j = 0; j < p; j++) {
            size_t n = comm_block_count(count, p, j);
            if (j == root || n == 0) { continue; }
            comm_nccl_check(c, "ncclRecv", ncclRecv(comm_at(recv, comm_block_offset(count, p, j), t), n, nt, j, c->nccl, c->stream));
        }
    } else if (mine > 0) {
        comm_nccl_check(c, "ncclSend", ncclSend(send, mine, nt, root, c->nccl, c->stream));
    }
    comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
    comm_sync(c, "gather_native");
}

static inline void scatter_device(Comm* c, const void* send, void* recv, size_t count, CommType t, int root) {
    int p = c->size, r = c->rank;
    size_t es = comm_type_size(t), mine = comm_block_count(count, p, r);
    if (c->staged) {
        NativeHostCopy s(c, send, r == root ? count * es : 0, true), o(c, recv, mine * es, false);
        { NativeAsHost h(c); scatter_native(c, s.host, o.host, count, t, root); }
        o.back();
        return;
    }
    if (mine > 0) { native_need_device(c, "scatter_native", "recv", recv); }
    if (r == root) {
        native_need_device(c, "scatter_native", "send", send);
        native_copy_async(c, recv, comm_at(send, comm_block_offset(count, p, r), t), mine * es);
    }
    ncclDataType_t nt = comm_nccl_type(t);
    comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
    if (r == root) {
        for (int j = 0; j < p; j++) {
            size_t n = comm_block_count(count, p, j);
            if (j == root || n == 0) { continue; }
            comm_nccl_check(c, "ncclSend", ncclSend(comm_at(send, comm_block_offset(count, p, j), t), n, nt, j, c->nccl, c->stream));
        }
    } else if (mine > 0) {
        comm_nccl_check(c, "ncclRecv", ncclRecv(recv, mine, nt, root, c->nccl, c->stream));
    }
    comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
    comm_sync(c, "scatter_native");
}

// every pair exchanges its block with grouped ncclSend/ncclRecv; in place, send is copied first
static inline void alltoall_device(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    int p = c->size, r = c->rank;
    size_t es = comm_type_size(t), total = count * (size_t)p * es;
    if (c->staged) {
        NativeHostCopy s(c, send, total, true), o(c, recv, total, false);
        { NativeAsHost h(c); alltoall_native(c, s.host, o.host, count, t); }
        o.back();
        return;
    }
    native_need_device(c, "alltoall_native", "send", send);
    native_need_device(c, "alltoall_native", "recv", recv);
    const void* s = send;
    if (send == recv) {
        s = comm_dev_stage(c, 0, total);
        native_copy_async(c, (void*)s, send, total);
    }
    native_copy_async(c, comm_at(recv, (size_t)r * count, t), comm_at(s, (size_t)r * count, t), count * es);
    ncclDataType_t nt = comm_nccl_type(t);
    comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
    for (int j = 0; j < p; j++) {
        if (j == r) { continue; }
        comm_nccl_check(c, "ncclSend", ncclSend(comm_at(s, (size_t)j * count, t), count, nt, j, c->nccl, c->stream));
        comm_nccl_check(c, "ncclRecv", ncclRecv(comm_at(recv, (size_t)j * count, t), count, nt, j, c->nccl, c->stream));
    }
    comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
    comm_sync(c, "alltoall_native");
}

// NCCL cannot check that a receiver expects what the sender sends: mismatched per-peer counts
// are undefined there (MPI reports them on the staged wire). Only this rank's own block is checked.
static inline void alltoallv_device(Comm* c, const void* send, const size_t* sendcounts, const size_t* sdispls,
                                    void* recv, const size_t* recvcounts, const size_t* rdispls, CommType t) {
    int p = c->size, r = c->rank;
    size_t es = comm_type_size(t), send_extent = 0, recv_extent = 0;
    for (int j = 0; j < p; j++) {
        if (sendcounts[j] > 0) { send_extent = std::max(send_extent, sdispls[j] + sendcounts[j]); }
        if (recvcounts[j] > 0) { recv_extent = std::max(recv_extent, rdispls[j] + recvcounts[j]); }
    }
    if (c->staged) {
        NativeHostCopy s(c, send, send_extent * es, true), o(c, recv, recv_extent * es, false);
        { NativeAsHost h(c); alltoallv_native(c, s.host, sendcounts, sdispls, o.host, recvcounts, rdispls, t); }
        o.back();
        return;
    }
    if (sendcounts[r] != recvcounts[r]) {
        comm_die(c, "alltoallv_native", "this rank sends itself %zu elements but expects %zu", sendcounts[r], recvcounts[r]);
    }
    if (send_extent > 0) { native_need_device(c, "alltoallv_native", "send", send); }
    if (recv_extent > 0) { native_need_device(c, "alltoallv_native", "recv", recv); }
    native_copy_async(c, comm_at(recv, rdispls[r], t), comm_at(send, sdispls[r], t), sendcounts[r] * es);
    ncclDataType_t nt = comm_nccl_type(t);
    comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
    for (int j = 0; j < p; j++) {
        if (j == r) { continue; }
        if (sendcounts[j] > 0) {
            comm_nccl_check(c, "ncclSend", ncclSend(comm_at(send, sdispls[j], t), sendcounts[j], nt, j, c->nccl, c->stream));
        }
        if (recvcounts[j] > 0) {
            comm_nccl_check(c, "ncclRecv", ncclRecv(comm_at(recv, rdispls[j], t), recvcounts[j], nt, j, c->nccl, c->stream));
        }
    }
    comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
    comm_sync(c, "alltoallv_native");
}
#endif   // LLMC_CUDA_COMM
