// The native collectives on device communicators (CUDA build only): the *_device twins that
// native.h's functions hand over to when the communicator is a device one. nccl* on the NCCL
// wire; on the host-staged wire (several ranks on one GPU), MPI on host copies: the buffers are
// copied on c->stream into the communicator's pinned host staging buffers (slot 0 the input,
// slot 1 the output), the host version runs on them (its scratch, e.g. bf16 widened to fp32 for
// MPI's reduction, is host memory: that is the wire), and the result is copied back on c->stream.
// Everything of a call runs on c->stream, which is synchronised before the call returns.
// native.h checks the arguments and includes this file in the CUDA build.
#pragma once

#include <algorithm>
#include "comm.h"
#include "native_mpi.h"

// Staged wire: run the MPI version on host copies, the communicator acting as a host one for
// the call (its scratch, its average and its copies on the host).
struct NativeAsHost {
    Comm* c;
    int device;
    explicit NativeAsHost(Comm* cc) : c(cc), device(cc->device) { c->device = 0; }
    ~NativeAsHost() { c->device = device; }
};
// A host view of a buffer: the buffer itself if it is host memory (or empty), else a copy in
// the communicator's pinned staging slot, filled from the device when `in`, written back by back().
struct NativeHostCopy {
    Comm* c;
    void* orig;
    void* host;
    size_t bytes;
    bool staged;
    NativeHostCopy(Comm* cc, int slot, const void* p, size_t n, bool in) : c(cc), orig((void*)p), host((void*)p), bytes(n), staged(false) {
        if (n == 0 || !comm_is_device_ptr(p)) { return; }
        host = comm_host_stage(c, slot, n);
        staged = true;
        if (in) {
            comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(host, p, n, cudaMemcpyDeviceToHost, c->stream));
            comm_sync(c, "native staged copy");
        }
    }
    void back() {
        if (!staged) { return; }
        comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(orig, host, bytes, cudaMemcpyHostToDevice, c->stream));
        comm_sync(c, "native staged copy");
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
        NativeHostCopy b(c, 0, buf, bytes, true);
        { NativeAsHost h(c); broadcast_mpi(c, b.host, count, t, root); }
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
        NativeHostCopy s(c, 0, send, bytes, true), r(c, 1, recv, at_root ? bytes : 0, false);
        { NativeAsHost h(c); reduce_mpi(c, s.host, r.host, count, t, op, root); }
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
        NativeHostCopy s(c, 0, send, bytes, true), r(c, 1, recv, bytes, false);
        { NativeAsHost h(c); allreduce_mpi(c, s.host, r.host, count, t, op); }
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
        NativeHostCopy s(c, 0, send, count * es, true), r(c, 1, recv, mine * es, false);
        { NativeAsHost h(c); reduce_scatter_mpi(c, s.host, r.host, count, t, op); }
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
        NativeHostCopy s(c, 0, send, comm_block_count(count, p, r) * es, true), o(c, 1, recv, count * es, false);
        { NativeAsHost h(c); allgather_mpi(c, s.host, o.host, count, t); }
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
        NativeHostCopy s(c, 0, send, mine * es, true), o(c, 1, recv, r == root ? count * es : 0, false);
        { NativeAsHost h(c); gather_mpi(c, s.host, o.host, count, t, root); }
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
        NativeHostCopy s(c, 0, send, r == root ? count * es : 0, true), o(c, 1, recv, mine * es, false);
        { NativeAsHost h(c); scatter_mpi(c, s.host, o.host, count, t, root); }
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
        NativeHostCopy s(c, 0, send, total, true), o(c, 1, recv, total, false);
        { NativeAsHost h(c); alltoall_mpi(c, s.host, o.host, count, t); }
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
        NativeHostCopy s(c, 0, send, send_extent * es, true), o(c, 1, recv, recv_extent * es, false);
        { NativeAsHost h(c); alltoallv_mpi(c, s.host, sendcounts, sdispls, o.host, recvcounts, rdispls, t); }
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
