// The device path of the communicator (CUDA build only; see "The device path" at the top of
// comm.h): choosing a GPU per rank, the NCCL communicator created from an id broadcast over
// MPI, the CUDA stream (one per communicator, blocking or not), the choice between the NCCL
// wire and the host-staged MPI wire, the device scratch kept with the communicator, the
// helpers the algorithms call (local reduce, copy) on c->stream, comm_wait_event, and the
// checks of CUDA and NCCL return codes. Built on comm_types.h (the Comm struct, comm_die) and
// the host loops of reduce_local_host.h; comm.h includes it in the CUDA build and calls it for
// device communicators and device pointers.
#pragma once

#include "comm_types.h"
#include "reduce_local_host.h"
#include "reduce_local.cuh"

// How many device communicators exist in this process: while none does, the pointer-taking
// helpers never call CUDA, so a CUDA build runs host-only programs without a GPU.
static inline int& comm_device_comms() {
    static int n = 0;
    return n;
}

static inline int comm_world_rank_for_errors(void) {
    int init = 0, r = -1;
    MPI_Initialized(&init);
    if (init) { MPI_Comm_rank(MPI_COMM_WORLD, &r); }
    return r;
}

// Every CUDA and NCCL return is checked: the error names the call, the rank and the reason.
static inline void comm_cuda_check(const Comm* c, const char* call, cudaError_t e) {
    if (e == cudaSuccess) { return; }
    if (c != NULL) { comm_die(c, call, "%s", cudaGetErrorString(e)); }
    die("%s on world rank %d: %s", call, comm_world_rank_for_errors(), cudaGetErrorString(e));
}
static inline void comm_nccl_check(const Comm* c, const char* call, ncclResult_t r) {
    if (r != ncclSuccess) { comm_die(c, call, "%s", ncclGetErrorString(r)); }
}

// Device (or managed) memory? Host memory, plain or pinned, is not. Only asked while a device
// communicator exists.
static inline bool comm_is_device_ptr(const void* p) {
    if (comm_device_comms() == 0 || p == NULL) { return false; }
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError();   // clear it: an unknown pointer is host memory
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static inline ncclDataType_t comm_nccl_type(CommType t) {
    if (t == COMM_FP32) { return ncclFloat32; }
    if (t == COMM_INT32) { return ncclInt32; }
    return ncclBfloat16;
}
// avg maps to ncclSum: the quotient is taken afterwards by comm_avg_finish's kernel, the same
// sum / p as the host path, so device and host results agree bit for bit. (ncclAvg's rounding
// is NCCL's own; for floats it may scale the inputs by 1/p before adding.)
static inline ncclRedOp_t comm_nccl_op(CommOp op) {
    if (op == COMM_MAX) { return ncclMax; }
    if (op == COMM_MIN) { return ncclMin; }
    return ncclSum;
}

// Staging buffers, grown on demand and kept with the communicator: slot 0 send, slot 1 recv.
static inline void* comm_host_stage(Comm* c, int slot, size_t bytes) {
    if (bytes > c->host_stage_bytes[slot]) {
        if (c->host_stage[slot] != NULL) { comm_cuda_check(c, "cudaFreeHost", cudaFreeHost(c->host_stage[slot])); }
        comm_cuda_check(c, "cudaMallocHost", cudaMallocHost(&c->host_stage[slot], bytes));
        c->host_stage_bytes[slot] = bytes;
    }
    return c->host_stage[slot];
}
static inline void* comm_dev_stage(Comm* c, int slot, size_t bytes) {
    if (bytes > c->dev_stage_bytes[slot]) {
        if (c->dev_stage[slot] != NULL) { comm_cuda_check(c, "cudaFree", cudaFree(c->dev_stage[slot])); }
        comm_cuda_check(c, "cudaMalloc", cudaMalloc(&c->dev_stage[slot], bytes));
        c->dev_stage_bytes[slot] = bytes;
    }
    return c->dev_stage[slot];
}

// One GPU per rank of a node, round robin over the node's GPUs (the node-local rank modulo
// the GPU count): with fewer GPUs than ranks, several ranks share one and the device
// communicators made afterwards use the staged wire. Collective over c.
static inline void comm_select_device(const Comm* c) {
    MPI_Comm node;
    MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    int n = 0;
    comm_cuda_check(c, "cudaGetDeviceCount", cudaGetDeviceCount(&n));
    if (n == 0) { comm_die(c, "comm_select_device", "no CUDA device"); }
    comm_cuda_check(c, "cudaSetDevice", cudaSetDevice(local % n));
}

// Do two ranks of c on one node use the same GPU? Compared by PCI bus id, not by device
// number, which CUDA_VISIBLE_DEVICES renumbers per process. Same answer on every rank of c.
static inline int comm_shares_gpu(const Comm* c, int dev) {
    char bus[32];
    memset(bus, 0, sizeof(bus));
    comm_cuda_check(c, "cudaDeviceGetPCIBusId", cudaDeviceGetPCIBusId(bus, (int)sizeof(bus) - 1, dev));
    MPI_Comm node;
    MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    int nlocal = 0;
    MPI_Comm_size(node, &nlocal);
    char* all = (char*)malloc((size_t)nlocal * sizeof(bus));
    if (all == NULL) { comm_die(c, "comm_enable_device", "out of host memory"); }
    MPI_Allgather(bus, (int)sizeof(bus), MPI_CHAR, all, (int)sizeof(bus), MPI_CHAR, node);
    int shared = 0;
    for (int i = 0; i < nlocal; i++) {
        for (int j = i + 1; j < nlocal; j++) {
            if (strncmp(all + i * sizeof(bus), all + j * sizeof(bus), sizeof(bus)) == 0) { shared = 1; }
        }
    }
    free(all);
    MPI_Comm_free(&node);
    int any = 0;
    MPI_Allreduce(&shared, &any, 1, MPI_INT, MPI_MAX, c->mpi);
    return any;
}

// Makes c a device communicator on the current GPU (cudaSetDevice first, or comm_select_device).
// Collective over c. force_staged = 1 (or LLMC_COMM_STAGED=1 in the environment) picks the
// staged wire even when NCCL could run, to compare the two. nonblocking = 1 makes c->stream a
// cudaStreamNonBlocking stream: not ordered with the legacy default (compute) stream at all, so
// that communication overlaps compute on the GPU; the caller then orders its data with events
// (comm_wait_event). 0: a blocking stream, which CUDA orders with the legacy stream both ways.
static inline void comm_enable_device(Comm* c, int force_staged, int nonblocking = 0) {
    if (c->device) { return; }
    comm_cuda_check(c, "cudaGetDevice", cudaGetDevice(&c->cuda_device));
    const char* env = getenv("LLMC_COMM_STAGED");
    int want = force_staged || (env != NULL && strcmp(env, "1") == 0);
    int any_want = 0;
    MPI_Allreduce(&want, &any_want, 1, MPI_INT, MPI_MAX, c->mpi);   // the wire must be the same on every rank
    // (a communicator of one rank never sends: no NCCL communicator to set up for it)
    c->staged = any_want || c->size == 1 || comm_shares_gpu(c, c->cuda_device);
    c->nonblocking = nonblocking;
    comm_cuda_check(c, "cudaStreamCreateWithFlags",
                    cudaStreamCreateWithFlags(&c->stream, nonblocking ? cudaStreamNonBlocking : cudaStreamDefault));
    c->nccl = NULL;
    if (!c->staged) {
        ncclUniqueId id;
        memset(&id, 0, sizeof(id));
        if (c->rank == 0) { comm_nccl_check(c, "ncclGetUniqueId", ncclGetUniqueId(&id)); }
        MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, c->mpi);
        comm_nccl_check(c, "ncclCommInitRank", ncclCommInitRank(&c->nccl, c->size, id, c->rank));
    }
    c->device = 1;
    comm_device_comms() += 1;
}

static inline void comm_disable_device(Comm* c) {
    if (!c->device) { return; }
    if (c->nccl != NULL) { comm_nccl_check(c, "ncclCommDestroy", ncclCommDestroy(c->nccl)); }
    comm_cuda_check(c, "cudaStreamDestroy", cudaStreamDestroy(c->stream));
    for (int s = 0; s < 2; s++) {
        if (c->host_stage[s] != NULL) { comm_cuda_check(c, "cudaFreeHost", cudaFreeHost(c->host_stage[s])); }
        if (c->dev_stage[s] != NULL) { comm_cuda_check(c, "cudaFree", cudaFree(c->dev_stage[s])); }
        c->host_stage[s] = c->dev_stage[s] = NULL;
        c->host_stage_bytes[s] = c->dev_stage_bytes[s] = 0;
    }
    for (int i = 0; i < COMM_SCRATCH_KEPT; i++) {
        if (c->scratch[i] != NULL) { comm_cuda_check(c, "cudaFree", cudaFree(c->scratch[i])); }
        c->scratch[i] = NULL;
        c->scratch_bytes[i] = 0;
        c->scratch_busy[i] = 0;
    }
    c->nccl = NULL;
    c->device = 0;
    comm_device_comms() -= 1;
}

static inline void comm_sync(const Comm* c, const char* call) {
    (void)call;
    comm_cuda_check(c, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
}

// CUDA's current GPU is per host thread, and a new thread starts on GPU 0: a thread other than
// the one that set the communicator up (the data-parallel communication thread) calls this
// first, so that its copies and kernels go to the communicator's GPU.
static inline void comm_bind_thread(const Comm* c) {
    if (c->device) { comm_cuda_check(c, "cudaSetDevice", cudaSetDevice(c->cuda_device)); }
}

// Makes c->stream's later work wait until the compute stream has reached the event (recorded
// with backend_event_record after the kernels that write what the collective reads). No host
// wait. A host communicator has no stream: nothing to do (comm.h has the CPU build's twin).
static inline void comm_wait_event(Comm* c, cudaEvent_t event) {
    if (!c->device || event == NULL) { return; }
    comm_cuda_check(c, "cudaStreamWaitEvent", cudaStreamWaitEvent(c->stream, event, 0));
}

// --- device scratch: COMM_SCRATCH_KEPT buffers kept with the communicator, each handed out
// again to any request it is large enough for (the smallest such), so per-layer collectives
// of the same sizes allocate nothing after the first call. A request no free buffer fits
// replaces the largest free one that is too small (cudaFree synchronises the device: only the
// first calls of a new, larger size pay it); when all are held, a buffer beyond them is
// allocated and freed on release. Used on c->stream only, and every call synchronises that
// stream before it returns, so a released buffer is never still in use.
static inline void* comm_scratch_device(Comm* c, size_t bytes) {
    int best = -1, empty = -1, small = -1;
    for (int i = 0; i < COMM_SCRATCH_KEPT; i++) {
        if (c->scratch[i] == NULL) {
            if (empty < 0) { empty = i; }
        } else if (!c->scratch_busy[i]) {
            if (c->scratch_bytes[i] >= bytes) {
                if (best < 0 || c->scratch_bytes[i] < c->scratch_bytes[best]) { best = i; }
            } else if (small < 0 || c->scratch_bytes[i] > c->scratch_bytes[small]) {
                small = i;
            }
        }
    }
    if (best >= 0) {
        c->scratch_busy[best] = 1;
        return c->scratch[best];
    }
    int slot = empty >= 0 ? empty : small;
    if (slot >= 0 && c->scratch[slot] != NULL) {
        comm_cuda_check(c, "cudaFree", cudaFree(c->scratch[slot]));
        c->scratch[slot] = NULL;
    }
    void* p = NULL;
    comm_cuda_check(c, "cudaMalloc", cudaMalloc(&p, bytes));
    c->scratch_mallocs++;
    if (slot >= 0) {
        c->scratch[slot] = p;
        c->scratch_bytes[slot] = bytes;
        c->scratch_busy[slot] = 1;
    }
    return p;
}
// false: p is not c's device scratch (host scratch, freed by the caller with free())
static inline bool comm_scratch_device_free(Comm* c, void* p) {
    if (!c->device) { return false; }
    for (int i = 0; i < COMM_SCRATCH_KEPT; i++) {
        if (c->scratch[i] == p) {
            c->scratch_busy[i] = 0;
            return true;
        }
    }
    if (!comm_is_device_ptr(p)) { return false; }
    comm_cuda_check(c, "cudaFree", cudaFree(p));   // one beyond the kept buffers
    return true;
}

// The local reduce of a device communicator, on c->stream: both buffers on the device ->
// one kernel; src on the host -> copied into device scratch first; dst on the host (only a
// caller's host buffer: the algorithms' scratch is device memory) -> src comes to host
// scratch and the host loop reduces (counted by comm_host_scratch_count).
static inline void comm_reduce_local_stream(Comm* c, void* dst, const void* src, size_t n, CommType t, CommOp op) {
    if (n == 0) { return; }
    bool dd = comm_is_device_ptr(dst), sd = comm_is_device_ptr(src);
    size_t bytes = n * comm_type_size(t);
    if (dd) {
        void* tmp = NULL;
        if (!sd) {
            tmp = comm_scratch_device(c, bytes);
            comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyHostToDevice, c->stream));
        }
        comm_cuda_check(c, "comm_reduce_local_kernel", comm_reduce_local_launch(dst, tmp ? tmp : src, n, t, op, c->stream));
        comm_sync(c, "comm_reduce_local");
        if (tmp != NULL) { comm_scratch_device_free(c, tmp); }
    } else if (sd) {
        void* tmp = comm_scratch(n, t);
        comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToHost, c->stream));
        comm_sync(c, "comm_reduce_local");
        comm_reduce_local_host(dst, tmp, n, t, op);
        free(tmp);
    } else {
        comm_reduce_local_host(dst, src, n, t, op);   // both on the host
    }
}
// A copy with a device communicator: on c->stream when either end is on the device (overlapping
// device ranges through scratch: cudaMemcpy, unlike memmove, does not allow overlap).
static inline void comm_copy_stream(Comm* c, void* dst, const void* src, size_t bytes) {
    bool dd = comm_is_device_ptr(dst), sd = comm_is_device_ptr(src);
    if (!dd && !sd) {
        memmove(dst, src, bytes);
        return;
    }
    const char *d = (const char*)dst, *s = (const char*)src;
    if (dd && sd && d < s + bytes && s < d + bytes) {
        void* tmp = comm_scratch_device(c, bytes);
        comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, c->stream));
        comm_sync(c, "comm_copy");
        comm_scratch_device_free(c, tmp);
        return;
    }
    comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream));
    comm_sync(c, "comm_copy");
}

// The helpers without a communicator (tests, collbench), on the legacy default stream.
// The local reduce when a buffer is on the device: dst and src both on the device -> kernel;
// one on each side -> src is copied to dst's side first. Returns false when both are host.
static inline bool comm_reduce_local_device(void* dst, const void* src, size_t n, CommType t, CommOp op) {
    if (n == 0) { return false; }
    bool dd = comm_is_device_ptr(dst), sd = comm_is_device_ptr(src);
    if (!dd && !sd) { return false; }
    size_t bytes = n * comm_type_size(t);
    if (dd && sd) {
        comm_cuda_check(NULL, "comm_reduce_local_kernel", comm_reduce_local_launch(dst, src, n, t, op, 0));
        comm_cuda_check(NULL, "cudaStreamSynchronize", cudaStreamSynchronize(0));
    } else if (dd) {
        void* tmp = NULL;
        comm_cuda_check(NULL, "cudaMalloc", cudaMalloc(&tmp, bytes));
        comm_cuda_check(NULL, "cudaMemcpy", cudaMemcpy(tmp, src, bytes, cudaMemcpyHostToDevice));
        comm_cuda_check(NULL, "comm_reduce_local_kernel", comm_reduce_local_launch(dst, tmp, n, t, op, 0));
        comm_cuda_check(NULL, "cudaStreamSynchronize", cudaStreamSynchronize(0));
        comm_cuda_check(NULL, "cudaFree", cudaFree(tmp));
    } else {
        void* tmp = malloc(bytes);
        if (tmp == NULL) { die("comm_reduce_local: out of host memory (%zu bytes)", bytes); }
        comm_cuda_check(NULL, "cudaMemcpy", cudaMemcpy(tmp, src, bytes, cudaMemcpyDeviceToHost));
        comm_reduce_local_host(dst, tmp, n, t, op);   // both on the host now
        free(tmp);
    }
    return true;
}
static inline bool comm_avg_finish_device(void* buf, size_t n, CommType t, int p) {
    if (n == 0 || !comm_is_device_ptr(buf)) { return false; }
    comm_cuda_check(NULL, "comm_avg_finish_kernel", comm_avg_finish_launch(buf, n, t, p, 0));
    comm_cuda_check(NULL, "cudaStreamSynchronize", cudaStreamSynchronize(0));
    return true;
}
// Copies with either end on the device; overlapping device ranges go through a temporary
// (cudaMemcpy, unlike memmove, does not allow overlap).
static inline bool comm_copy_device(void* dst, const void* src, size_t bytes) {
    bool dd = comm_is_device_ptr(dst), sd = comm_is_device_ptr(src);
    if (!dd && !sd) { return false; }
    const char *d = (const char*)dst, *s = (const char*)src;
    if (dd && sd && d < s + bytes && s < d + bytes) {
        void* tmp = NULL;
        comm_cuda_check(NULL, "cudaMalloc", cudaMalloc(&tmp, bytes));
        comm_cuda_check(NULL, "cudaMemcpy", cudaMemcpy(tmp, src, bytes, cudaMemcpyDeviceToDevice));
        comm_cuda_check(NULL, "cudaMemcpy", cudaMemcpy(dst, tmp, bytes, cudaMemcpyDeviceToDevice));
        comm_cuda_check(NULL, "cudaFree", cudaFree(tmp));
    } else {
        comm_cuda_check(NULL, "cudaMemcpy", cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
    }
    return true;
}
