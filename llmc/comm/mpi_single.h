// mpi_single.h: MPI for one process, the build without MPI (no -DUSE_MPI; comm.h includes it
// in place of <mpi.h>).
//
// Why a stand-in rather than #ifdefs: the trainer builds one plan from the mesh and the flags,
// and a run on one process is the same program as a run on many, only with communicators of
// size 1. With this file llmc/comm/, the plan and main compile the same way with and without
// MPI, and nothing in them asks which build it is (comm_mpi_available() says so where a feature
// really needs several processes).
//
// It covers the part of MPI this repository calls, and nothing more. There is one process:
// MPI_COMM_WORLD and every communicator made from it (dup, split, split_type) have size 1 and
// rank 0. The collectives do what MPI does with one rank: the result is the input, so each
// copies its send buffer to its receive buffer (nothing to do with MPI_IN_PLACE), block 0 of
// the v-variants at its displacement, the byte count from the datatype. The reduction op does
// not matter: the sum, max or min of one value is that value. The root must be 0.
// Point-to-point messages cannot happen: with one rank there is no peer, and the algorithms
// never send to themselves (transport.h refuses it). MPI_Send, MPI_Recv, MPI_Sendrecv, MPI_Isend and
// MPI_Irecv die
// naming the call instead of hanging.
#pragma once

#include "../common.h"

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;
typedef int MPI_Info;
typedef struct { int MPI_SOURCE, MPI_TAG, MPI_ERROR, bytes; } MPI_Status;

#define MPI_SUCCESS 0
#define MPI_COMM_NULL 0
#define MPI_COMM_WORLD 1
#define MPI_IN_PLACE ((void*)1)
#define MPI_STATUS_IGNORE ((MPI_Status*)0)
#define MPI_INFO_NULL 0
#define MPI_COMM_TYPE_SHARED 1
#define MPI_THREAD_SINGLE 0
#define MPI_THREAD_FUNNELED 1
#define MPI_THREAD_SERIALIZED 2
#define MPI_THREAD_MULTIPLE 3

// datatypes: an id each; mpi_single_size gives its bytes
#define MPI_BYTE 1
#define MPI_CHAR 2
#define MPI_INT 3
#define MPI_LONG 4
#define MPI_LONG_LONG 5
#define MPI_UNSIGNED 6
#define MPI_UNSIGNED_LONG_LONG 7
#define MPI_FLOAT 8
#define MPI_DOUBLE 9
#define MPI_UINT16_T 10
#define MPI_INT32_T 11
#define MPI_UINT32_T 12
#define MPI_INT64_T 13
#define MPI_UINT64_T 14

#define MPI_SUM 1
#define MPI_MAX 2
#define MPI_MIN 3

static inline size_t mpi_single_size(MPI_Datatype t) {
    switch (t) {
        case MPI_BYTE: case MPI_CHAR: return 1;
        case MPI_UINT16_T: return 2;
        case MPI_INT: case MPI_UNSIGNED: case MPI_FLOAT: case MPI_INT32_T: case MPI_UINT32_T: return 4;
        case MPI_LONG: return sizeof(long);
        case MPI_LONG_LONG: case MPI_UNSIGNED_LONG_LONG: case MPI_DOUBLE: case MPI_INT64_T: case MPI_UINT64_T: return 8;
    }
    die("mpi_single (the build without MPI): unknown datatype %d", t);
}

static inline void mpi_single_check(MPI_Comm comm, const char* call) {
    if (comm == MPI_COMM_NULL) { die("%s on MPI_COMM_NULL (build without MPI)", call); }
}
static inline void mpi_single_check_root(int root, const char* call) {
    if (root != 0) { die("%s: root %d, but the build without MPI has one rank (root 0)", call, root); }
}
// The one-rank collective: count elements of type t from send to recv, unless in place.
static inline int mpi_single_copy(const void* send, void* recv, int count, MPI_Datatype t) {
    if (send == MPI_IN_PLACE || recv == MPI_IN_PLACE || send == recv || count <= 0) { return MPI_SUCCESS; }
    memmove(recv, send, (size_t)count * mpi_single_size(t));
    return MPI_SUCCESS;
}
static inline void* mpi_single_at(void* buf, int elems, MPI_Datatype t) { return (char*)buf + (size_t)elems * mpi_single_size(t); }
static inline const void* mpi_single_at(const void* buf, int elems, MPI_Datatype t) {
    return buf == MPI_IN_PLACE ? buf : (const char*)buf + (size_t)elems * mpi_single_size(t);
}
static inline int mpi_single_new_comm(void) {
    static int next = MPI_COMM_WORLD;
    return ++next;
}
static inline int* mpi_single_initialized(void) {
    static int initialized = 0;
    return &initialized;
}

// --- set-up

static inline int MPI_Init(int*, char***) { *mpi_single_initialized() = 1; return MPI_SUCCESS; }
static inline int MPI_Init_thread(int*, char***, int required, int* provided) {
    *mpi_single_initialized() = 1;
    *provided = required;   // one thread or many, one process has no one to race with
    return MPI_SUCCESS;
}
static inline int MPI_Initialized(int* flag) { *flag = *mpi_single_initialized(); return MPI_SUCCESS; }
static inline int MPI_Finalize(void) { return MPI_SUCCESS; }
static inline double MPI_Wtime(void) { return wall_seconds(); }

// --- communicators: all of size 1

static inline int MPI_Comm_rank(MPI_Comm comm, int* rank) { mpi_single_check(comm, "MPI_Comm_rank"); *rank = 0; return MPI_SUCCESS; }
static inline int MPI_Comm_size(MPI_Comm comm, int* size) { mpi_single_check(comm, "MPI_Comm_size"); *size = 1; return MPI_SUCCESS; }
static inline int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
    mpi_single_check(comm, "MPI_Comm_dup");
    *out = mpi_single_new_comm();
    return MPI_SUCCESS;
}
static inline int MPI_Comm_split(MPI_Comm comm, int, int, MPI_Comm* out) {
    mpi_single_check(comm, "MPI_Comm_split");
    *out = mpi_single_new_comm();
    return MPI_SUCCESS;
}
static inline int MPI_Comm_split_type(MPI_Comm comm, int, int, MPI_Info, MPI_Comm* out) {
    mpi_single_check(comm, "MPI_Comm_split_type");
    *out = mpi_single_new_comm();
    return MPI_SUCCESS;
}
static inline int MPI_Comm_free(MPI_Comm* comm) {
    mpi_single_check(*comm, "MPI_Comm_free");
    *comm = MPI_COMM_NULL;
    return MPI_SUCCESS;
}
static inline int MPI_Barrier(MPI_Comm comm) { mpi_single_check(comm, "MPI_Barrier"); return MPI_SUCCESS; }

// --- collectives: the result of one rank is its own input

static inline int MPI_Bcast(void*, int, MPI_Datatype, int root, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Bcast");
    mpi_single_check_root(root, "MPI_Bcast");
    return MPI_SUCCESS;
}
static inline int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype t, MPI_Op, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Allreduce");
    return mpi_single_copy(send, recv, count, t);
}
static inline int MPI_Reduce(const void* send, void* recv, int count, MPI_Datatype t, MPI_Op, int root, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Reduce");
    mpi_single_check_root(root, "MPI_Reduce");
    return mpi_single_copy(send, recv, count, t);
}
static inline int MPI_Reduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype t, MPI_Op, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Reduce_scatter_block");
    return mpi_single_copy(send, recv, count, t);
}
static inline int MPI_Reduce_scatter(const void* send, void* recv, const int* counts, MPI_Datatype t, MPI_Op, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Reduce_scatter");
    return mpi_single_copy(send, recv, counts[0], t);
}
static inline int MPI_Allgather(const void* send, int scount, MPI_Datatype st, void* recv, int, MPI_Datatype, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Allgather");
    return mpi_single_copy(send, recv, scount, st);
}
static inline int MPI_Allgatherv(const void* send, int scount, MPI_Datatype st, void* recv, const int*, const int* displs,
                                 MPI_Datatype rt, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Allgatherv");
    return mpi_single_copy(send, mpi_single_at(recv, displs[0], rt), scount, st);
}
static inline int MPI_Gather(const void* send, int scount, MPI_Datatype st, void* recv, int, MPI_Datatype, int root, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Gather");
    mpi_single_check_root(root, "MPI_Gather");
    return mpi_single_copy(send, recv, scount, st);
}
static inline int MPI_Gatherv(const void* send, int scount, MPI_Datatype st, void* recv, const int*, const int* displs,
                              MPI_Datatype rt, int root, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Gatherv");
    mpi_single_check_root(root, "MPI_Gatherv");
    return mpi_single_copy(send, mpi_single_at(recv, displs[0], rt), scount, st);
}
static inline int MPI_Scatter(const void* send, int, MPI_Datatype, void* recv, int rcount, MPI_Datatype rt, int root, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Scatter");
    mpi_single_check_root(root, "MPI_Scatter");
    return mpi_single_copy(send, recv, rcount, rt);
}
static inline int MPI_Scatterv(const void* send, const int*, const int* displs, MPI_Datatype st, void* recv, int rcount,
                               MPI_Datatype rt, int root, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Scatterv");
    mpi_single_check_root(root, "MPI_Scatterv");
    return mpi_single_copy(mpi_single_at(send, displs[0], st), recv, rcount, rt);
}
static inline int MPI_Alltoall(const void* send, int scount, MPI_Datatype st, void* recv, int, MPI_Datatype, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Alltoall");
    return mpi_single_copy(send, recv, scount, st);
}
static inline int MPI_Alltoallv(const void* send, const int* scounts, const int* sdispls, MPI_Datatype st, void* recv,
                                const int*, const int* rdispls, MPI_Datatype rt, MPI_Comm comm) {
    mpi_single_check(comm, "MPI_Alltoallv");
    return mpi_single_copy(mpi_single_at(send, sdispls[0], st), mpi_single_at(recv, rdispls[0], rt), scounts[0], st);
}

// --- point-to-point: no peer exists

__attribute__((noreturn)) static inline void mpi_single_no_peer(const char* call, int peer) {
    die("%s to/from rank %d: the build without MPI has one rank and no peer (build with mpicxx and -DUSE_MPI)", call, peer);
}
static inline int MPI_Send(const void*, int, MPI_Datatype, int dst, int, MPI_Comm) { mpi_single_no_peer("MPI_Send", dst); }
static inline int MPI_Recv(void*, int, MPI_Datatype, int src, int, MPI_Comm, MPI_Status*) { mpi_single_no_peer("MPI_Recv", src); }
static inline int MPI_Sendrecv(const void*, int, MPI_Datatype, int dst, int, void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Status*) {
    mpi_single_no_peer("MPI_Sendrecv", dst);
}
typedef int MPI_Request;
#define MPI_REQUEST_NULL 0
static inline int MPI_Isend(const void*, int, MPI_Datatype, int dst, int, MPI_Comm, MPI_Request*) { mpi_single_no_peer("MPI_Isend", dst); }
static inline int MPI_Irecv(void*, int, MPI_Datatype, int src, int, MPI_Comm, MPI_Request*) { mpi_single_no_peer("MPI_Irecv", src); }
static inline int MPI_Waitall(int, MPI_Request*, MPI_Status*) { return MPI_SUCCESS; }   // nothing can be pending
static inline int MPI_Get_count(const MPI_Status* st, MPI_Datatype t, int* count) {
    *count = st->bytes / (int)mpi_single_size(t);
    return MPI_SUCCESS;
}
