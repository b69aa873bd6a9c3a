// The device path of the communicator (CUDA build only; see "The device path" at the top of
// comm.h): choosing a GPU per rank, the NCCL communicator created from an id broadcast over
// MPI, the CUDA stream, the choice between the NCCL wire and the host-staged MPI wire, and
// the checks of CUDA and NCCL return codes.
// Included by comm.h in the middle (it needs the Comm struct and comm_die); not on its own.
#pragma once

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
// staged wire even when NCCL could run, to compare the two.
static inline void comm_enable_device(Comm* c, int force_staged) {
    if (c->device) { return; }
    comm_cuda_check(c, "cudaGetDevice", cudaGetDevice(&c->cuda_device));
    const char* env = getenv("LLMC_COMM_STAGED");
    int want = force_staged || (env != NULL && strcmp(env, "1") == 0);
    int any_want = 0;
    MPI_Allreduce(&want, &any_want, 1, MPI_INT, MPI_MAX, c->mpi);   // the wire must be the same on every rank
    c->staged = any_want || comm_shares_gpu(c, c->cuda_device);
    comm_cuda_check(c, "cudaStreamCreate", cudaStreamCreate(&c->stream));
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
    c->nccl = NULL;
    c->device = 0;
    comm_device_comms() -= 1;
}

static inline void comm_sync(const Comm* c, const char* call) {
    (void)call;
    comm_cuda_check(c, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
}

static inline void comm_reduce_local(void* dst, const void* src, size_t n, CommType t, CommOp op);

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
        comm_reduce_local(dst, tmp, n, t, op);   // both on the host now
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
