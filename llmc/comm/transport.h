// Transport: point-to-point messages between two ranks of a communicator. The educational
// algorithms (ring.h, tree.h, recursive.h) use nothing else to communicate, so moving them to
// another wire (NCCL's ncclSend/ncclRecv on device buffers, below) means changing only this file.
//
// Host buffers over MPI. Each call adds what it sends to comm->bytes_sent and
// comm->messages_sent (a zero-length message still counts as a message). Messages between
// the same two ranks arrive in the order they were sent (MPI's non-overtaking rule), which is
// all the algorithms rely on; one tag is enough. A receive checks that the message had the
// expected size, so ranks that disagree on a count get an error instead of corrupt data.
//
// Device communicators (CUDA build, comm.h's "The device path"): the wire is the
// communicator's, the same on every rank, whatever memory each buffer lives in:
//   NCCL wire    ncclSend/ncclRecv inside ncclGroupStart/End on c->stream, then the stream is
//                synchronised. A host buffer (a caller's: the algorithms' scratch is device
//                memory on a device communicator) is copied through a device staging buffer.
//                Zero-length messages are counted but not sent (both ends know the count). NCCL
//                cannot check a received size: a count mismatch is caught by comm_check_args
//                before the algorithm starts, or not at all.
//   staged wire  a device buffer is copied to pinned host memory on c->stream, sent with the
//                same MPI calls as a host buffer (size check included), and copied back to the
//                device on c->stream; each copy is waited for (c->stream only) before MPI reads
//                the host copy or the call returns.
// Both count exactly the bytes and messages the host path counts.
#pragma once

#include <vector>
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

#ifdef LLMC_CUDA_COMM
// One NCCL exchange: send (if dst >= 0 and scount > 0) and receive (if src >= 0 and rcount > 0)
// as one group, so that two ranks sending to each other cannot deadlock.
static inline void comm_nccl_p2p(Comm* c, const char* call, const void* sendbuf, size_t scount, int dst,
                                 void* recvbuf, size_t rcount, int src, CommType t) {
    bool do_send = dst >= 0 && scount > 0, do_recv = src >= 0 && rcount > 0;
    if (!do_send && !do_recv) { return; }
    size_t sbytes = scount * comm_type_size(t), rbytes = rcount * comm_type_size(t);
    const void* s = sendbuf;
    void* r = recvbuf;
    if (do_send && !comm_is_device_ptr(sendbuf)) {   // ordered before the send by the stream
        s = comm_dev_stage(c, 0, sbytes);
        comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync((void*)s, sendbuf, sbytes, cudaMemcpyHostToDevice, c->stream));
    }
    bool recv_host = do_recv && !comm_is_device_ptr(recvbuf);
    if (recv_host) { r = comm_dev_stage(c, 1, rbytes); }
    comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
    if (do_send) { comm_nccl_check(c, "ncclSend", ncclSend(s, scount, comm_nccl_type(t), dst, c->nccl, c->stream)); }
    if (do_recv) { comm_nccl_check(c, "ncclRecv", ncclRecv(r, rcount, comm_nccl_type(t), src, c->nccl, c->stream)); }
    comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
    if (recv_host) { comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(recvbuf, r, rbytes, cudaMemcpyDeviceToHost, c->stream)); }
    comm_sync(c, call);
}

// Staged wire: the host address MPI sends from (a pinned copy of a device buffer) ...
static inline const void* comm_stage_out(Comm* c, int slot, const void* buf, size_t bytes) {
    if (bytes == 0 || !comm_is_device_ptr(buf)) { return buf; }
    void* h = comm_host_stage(c, slot, bytes);
    comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(h, buf, bytes, cudaMemcpyDeviceToHost, c->stream));
    comm_sync(c, "comm_stage_out");   // MPI reads it next
    return h;
}
// ... and the host address MPI receives into; comm_stage_in_finish moves it to the device.
static inline void* comm_stage_in(Comm* c, int slot, void* buf, size_t bytes) {
    if (bytes == 0 || !comm_is_device_ptr(buf)) { return buf; }
    return comm_host_stage(c, slot, bytes);
}
static inline void comm_stage_in_finish(Comm* c, void* buf, const void* staged, size_t bytes) {
    if (staged == buf) { return; }
    comm_cuda_check(c, "cudaMemcpyAsync", cudaMemcpyAsync(buf, staged, bytes, cudaMemcpyHostToDevice, c->stream));
    comm_sync(c, "comm_stage_in");   // the data in place, and the pinned copy free for the next message
}
#endif

static inline void comm_send(Comm* c, const void* buf, size_t count, CommType t, int peer) {
    comm_check_peer(c, "comm_send", peer);
    size_t bytes = count * comm_type_size(t);
#ifdef LLMC_CUDA_COMM
    if (c->device && !c->staged) {
        comm_nccl_p2p(c, "comm_send", buf, count, peer, NULL, 0, -1, t);
        c->bytes_sent += bytes;
        c->messages_sent += 1;
        return;
    }
    if (c->device) { buf = comm_stage_out(c, 0, buf, bytes); }
#endif
    MPI_Send(buf, comm_int_count(c, "comm_send", bytes), MPI_BYTE, peer, COMM_TAG, c->mpi);
    c->bytes_sent += bytes;
    c->messages_sent += 1;
}

static inline void comm_recv(Comm* c, void* buf, size_t count, CommType t, int peer) {
    comm_check_peer(c, "comm_recv", peer);
    size_t bytes = count * comm_type_size(t);
    MPI_Status st;
#ifdef LLMC_CUDA_COMM
    if (c->device && !c->staged) {
        comm_nccl_p2p(c, "comm_recv", NULL, 0, -1, buf, count, peer, t);
        return;
    }
    void* dev_buf = buf;
    if (c->device) { buf = comm_stage_in(c, 1, buf, bytes); }
#endif
    MPI_Recv(buf, comm_int_count(c, "comm_recv", bytes), MPI_BYTE, peer, COMM_TAG, c->mpi, &st);
    comm_check_received(c, "comm_recv", &st, bytes, peer);
#ifdef LLMC_CUDA_COMM
    if (c->device) { comm_stage_in_finish(c, dev_buf, buf, bytes); }
#endif
}

#ifdef LLMC_CUDA_COMM
// comm_sendrecv on a device communicator: one NCCL group, or MPI through pinned host copies
static inline void comm_sendrecv_device(Comm* c, const void* sendbuf, size_t sendcount, int dst,
                                        void* recvbuf, size_t recvcount, int src, CommType t) {
    size_t sbytes = sendcount * comm_type_size(t), rbytes = recvcount * comm_type_size(t);
    if (c->staged) {
        MPI_Status st;
        const void* s = comm_stage_out(c, 0, sendbuf, sbytes);
        void* r = comm_stage_in(c, 1, recvbuf, rbytes);
        MPI_Sendrecv(s, comm_int_count(c, "comm_sendrecv", sbytes), MPI_BYTE, dst, COMM_TAG,
                     r, comm_int_count(c, "comm_sendrecv", rbytes), MPI_BYTE, src, COMM_TAG, c->mpi, &st);
        comm_check_received(c, "comm_sendrecv", &st, rbytes, src);
        comm_stage_in_finish(c, recvbuf, r, rbytes);
    } else {
        comm_nccl_p2p(c, "comm_sendrecv", sendbuf, sendcount, dst, recvbuf, recvcount, src, t);
    }
    c->bytes_sent += sbytes;
    c->messages_sent += 1;
}
#endif

// Send to one peer and receive from another (or the same) at once: the step of every ring and
// butterfly. Done together so that two ranks exchanging large messages cannot deadlock.
static inline void comm_sendrecv(Comm* c, const void* sendbuf, size_t sendcount, int dst,
                                 void* recvbuf, size_t recvcount, int src, CommType t) {
    comm_check_peer(c, "comm_sendrecv", dst);
    comm_check_peer(c, "comm_sendrecv", src);
#ifdef LLMC_CUDA_COMM
    if (c->device) { comm_sendrecv_device(c, sendbuf, sendcount, dst, recvbuf, recvcount, src, t); return; }
#endif
    size_t sbytes = sendcount * comm_type_size(t), rbytes = recvcount * comm_type_size(t);
    MPI_Status st;
    MPI_Sendrecv(sendbuf, comm_int_count(c, "comm_sendrecv", sbytes), MPI_BYTE, dst, COMM_TAG,
                 recvbuf, comm_int_count(c, "comm_sendrecv", rbytes), MPI_BYTE, src, COMM_TAG, c->mpi, &st);
    comm_check_received(c, "comm_sendrecv", &st, rbytes, src);
    c->bytes_sent += sbytes;
    c->messages_sent += 1;
}

// ---------------------------------------------------------------------------------------
// An exchange: several messages, sends and receives to and from any peers, posted together and
// complete together (the pipeline's runs of sends and receives, llmc/parallel/pp.h). Posting
// them together is what lets two ranks that send to each other both get through even when a
// send waits for its receive (NCCL; MPI above its eager limit): MPI_Isend/MPI_Irecv + Waitall,
// or one ncclGroupStart/End. Messages between the same two ranks are matched in posting order
// (NCCL has no tags; MPI gets each message's tag as well). Sends are counted like comm_send's.
typedef struct {
    const void* send;   // a send's buffer (NULL for a receive)
    void* recv;         // a receive's buffer (NULL for a send)
    size_t count;
    int peer;
    int tag;            // MPI tag, < 32767
} CommMsg;

// The exchange in two halves, so that work can run while the messages travel (ring attention,
// llmc/parallel/cp.h): comm_exchange_start posts every message and returns; comm_exchange_finish
// waits for all of them (and checks the received sizes). Between the two the buffers belong to
// the wire: do not touch them. On the NCCL wire the messages run on c->stream; with a
// non-blocking stream (comm_enable_device's `nonblocking`), kernels launched between start and
// finish on the compute stream run at the same time as the transfer.
typedef struct {
    Comm* c;
    CommType t;
    std::vector<CommMsg> msgs;
    std::vector<MPI_Request> req;
    std::vector<std::vector<char>> staged;   // the staged wire: host copies of device buffers
    int nccl;                                // 1: the messages are in flight on c->stream
} CommPending;

#ifdef LLMC_CUDA_COMM
// the exchange on the NCCL wire: one group of sends and receives on c->stream (device buffers)
static inline void comm_exchange_nccl(Comm* c, const CommMsg* msgs, int n, CommType t) {
    comm_nccl_check(c, "ncclGroupStart", ncclGroupStart());
    for (int i = 0; i < n; i++) {
        if (msgs[i].count == 0) { continue; }
        if (!comm_is_device_ptr(msgs[i].send ? msgs[i].send : msgs[i].recv)) {
            comm_die(c, "comm_exchange", "message %d: a host buffer on the NCCL wire", i);
        }
        if (msgs[i].send) {
            comm_nccl_check(c, "ncclSend", ncclSend(msgs[i].send, msgs[i].count, comm_nccl_type(t), msgs[i].peer, c->nccl, c->stream));
        } else {
            comm_nccl_check(c, "ncclRecv", ncclRecv(msgs[i].recv, msgs[i].count, comm_nccl_type(t), msgs[i].peer, c->nccl, c->stream));
        }
    }
    comm_nccl_check(c, "ncclGroupEnd", ncclGroupEnd());
}
// the staged wire: message i's device buffer goes through a host copy, p->staged[i] (a send's
// copied now, a receive's moved to the device by comm_exchange_unstage when it has arrived)
static inline void comm_exchange_stage(CommPending* p, int i, size_t bytes, const void** sbuf, void** rbuf) {
    if (!p->c->device || bytes == 0 || !comm_is_device_ptr(*sbuf ? *sbuf : *rbuf)) { return; }
    p->staged[i].resize(bytes);
    if (*sbuf) {
        comm_cuda_check(p->c, "cudaMemcpy", cudaMemcpy(p->staged[i].data(), *sbuf, bytes, cudaMemcpyDeviceToHost));
        *sbuf = p->staged[i].data();
    } else {
        *rbuf = p->staged[i].data();
    }
}
static inline void comm_exchange_unstage(CommPending* p, int i, size_t bytes) {
    if (p->staged[i].empty()) { return; }
    comm_cuda_check(p->c, "cudaMemcpy", cudaMemcpy(p->msgs[i].recv, p->staged[i].data(), bytes, cudaMemcpyHostToDevice));
}
#endif

static inline void comm_exchange_start(Comm* c, const CommMsg* msgs, int n, CommType t, CommPending* p) {
    for (int i = 0; i < n; i++) {
        comm_check_peer(c, "comm_exchange", msgs[i].peer);
        if ((msgs[i].send == NULL) == (msgs[i].recv == NULL)) { comm_die(c, "comm_exchange", "message %d is neither one send nor one receive", i); }
    }
    p->c = c;
    p->t = t;
    p->msgs.assign(msgs, msgs + n);
    p->nccl = 0;
    p->req.assign(n, MPI_REQUEST_NULL);
    p->staged.assign(n, std::vector<char>());
#ifdef LLMC_CUDA_COMM
    if (c->device && !c->staged) { comm_exchange_nccl(c, msgs, n, t); p->nccl = 1; return; }
#endif
    for (int i = 0; i < n; i++) {
        size_t bytes = msgs[i].count * comm_type_size(t);
        const void* sbuf = msgs[i].send;
        void* rbuf = msgs[i].recv;
#ifdef LLMC_CUDA_COMM
        comm_exchange_stage(p, i, bytes, &sbuf, &rbuf);
#endif
        int nb = comm_int_count(c, "comm_exchange", bytes);
        if (sbuf) { MPI_Isend(sbuf, nb, MPI_BYTE, msgs[i].peer, msgs[i].tag, c->mpi, &p->req[i]); }
        else { MPI_Irecv(rbuf, nb, MPI_BYTE, msgs[i].peer, msgs[i].tag, c->mpi, &p->req[i]); }
    }
}

static inline void comm_exchange_finish(CommPending* p) {
    Comm* c = p->c;
    size_t esize = comm_type_size(p->t);
    int n = (int)p->msgs.size();
    if (!p->nccl) {
        std::vector<MPI_Status> st(n);
        MPI_Waitall(n, p->req.data(), st.data());
        for (int i = 0; i < n; i++) {
            if (p->msgs[i].send) { continue; }
            comm_check_received(c, "comm_exchange", &st[i], p->msgs[i].count * esize, p->msgs[i].peer);
#ifdef LLMC_CUDA_COMM
            comm_exchange_unstage(p, i, p->msgs[i].count * esize);
#endif
        }
    }
#ifdef LLMC_CUDA_COMM
    if (p->nccl) { comm_sync(c, "comm_exchange"); }
#endif
    for (int i = 0; i < n; i++) {
        if (p->msgs[i].send) { c->bytes_sent += p->msgs[i].count * esize; c->messages_sent += 1; }
    }
    p->msgs.clear();
}

static inline void comm_exchange(Comm* c, const CommMsg* msgs, int n, CommType t) {
    CommPending p;
    comm_exchange_start(c, msgs, n, t, &p);
    comm_exchange_finish(&p);
}
