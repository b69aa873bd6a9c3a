// Transport: point-to-point messages between two ranks of a communicator. The educational
// algorithms (ring.h, tree.h, recursive.h) use nothing else to communicate, so moving them to
// another wire (NCCL's ncclSend/ncclRecv on device buffers, later) means changing only this file.
//
// Host buffers over MPI. Each call adds what it sends to comm->bytes_sent and
// comm->messages_sent (a zero-length message still counts as a message). Messages between
// the same two ranks arrive in the order they were sent (MPI's non-overtaking rule), which is
// all the algorithms rely on; one tag is enough. A receive checks that the message had the
// expected size, so ranks that disagree on a count get an error instead of corrupt data.
#pragma once

#include "comm.h"

static inline void comm_check_peer(const Comm* c, const char* call, int peer) {
    if (peer < 0 || peer >= c->size) { comm_die(c, call, "peer %d out of range [0, %d)", peer, c->size); }
    if (peer == c->rank) { comm_die(c, call, "peer %d is this rank itself", peer); }
}

static inline void comm_check_received(const Comm* c, const char* call, const MPI_Status* st, size_t bytes, int peer) {
    int got = 0;
    MPI_Get_count(st, MPI_BYTE, &got);
    if ((size_t)got != bytes) {
        comm_die(c, call, "received %d bytes from rank %d, expected %zu (do the ranks agree on count and type?)",
                 got, peer, bytes);
    }
}

static const int COMM_TAG = 4242;

static inline void comm_send(Comm* c, const void* buf, size_t count, CommType t, int peer) {
    comm_check_peer(c, "comm_send", peer);
    size_t bytes = count * comm_type_size(t);
    MPI_Send(buf, comm_int_count(c, "comm_send", bytes), MPI_BYTE, peer, COMM_TAG, c->mpi);
    c->bytes_sent += bytes;
    c->messages_sent += 1;
}

static inline void comm_recv(Comm* c, void* buf, size_t count, CommType t, int peer) {
    comm_check_peer(c, "comm_recv", peer);
    size_t bytes = count * comm_type_size(t);
    MPI_Status st;
    MPI_Recv(buf, comm_int_count(c, "comm_recv", bytes), MPI_BYTE, peer, COMM_TAG, c->mpi, &st);
    comm_check_received(c, "comm_recv", &st, bytes, peer);
}

// Send to one peer and receive from another (or the same) at once: the step of every ring and
// butterfly. Done together so that two ranks exchanging large messages cannot deadlock.
static inline void comm_sendrecv(Comm* c, const void* sendbuf, size_t sendcount, int dst,
                                 void* recvbuf, size_t recvcount, int src, CommType t) {
    comm_check_peer(c, "comm_sendrecv", dst);
    comm_check_peer(c, "comm_sendrecv", src);
    size_t sbytes = sendcount * comm_type_size(t), rbytes = recvcount * comm_type_size(t);
    MPI_Status st;
    MPI_Sendrecv(sendbuf, comm_int_count(c, "comm_sendrecv", sbytes), MPI_BYTE, dst, COMM_TAG,
                 recvbuf, comm_int_count(c, "comm_sendrecv", rbytes), MPI_BYTE, src, COMM_TAG, c->mpi, &st);
    comm_check_received(c, "comm_sendrecv", &st, rbytes, src);
    c->bytes_sent += sbytes;
    c->messages_sent += 1;
}
