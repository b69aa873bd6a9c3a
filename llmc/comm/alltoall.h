// Pairwise all-to-all: p-1 steps; in each step every rank sends one block straight to the rank
// that needs it and receives one block from the rank that has its next one. Rank r's send
// block j goes to rank j's recv block r (the same layout as alltoall_native).
//
// Partners at step s (s = 1 .. p-1):
//   p a power of two: exchange with r XOR s (both directions with the same partner)
//   otherwise:        send to (r + s) mod p, receive from (r - s) mod p
//
//   p = 4, XOR pairing (rank: partner per step):    p = 3, shift pairing (send -> / <- receive):
//   step 1:  0<->1  2<->3                            step 1:  0->1  1->2  2->0
//   step 2:  0<->2  1<->3                            step 2:  0->2  1->0  2->1
//   step 3:  0<->3  1<->2
//   the own block (j = r) is a local copy
//
// Cost (n = bytes per pair, S = p n the whole send buffer): (p-1) alpha + (p-1) n beta, i.e.
// (p-1)/p S beta, the least any all-to-all can send; p-1 messages, so Bruck (bruck.h, log2 p
// messages but more bytes) wins for small blocks.
//
// All-to-all-v (MoE's token exchange): the same schedule with per-peer counts and offsets;
// rank r sends sendcounts[j] elements from send + sdispls[j] to rank j, which must expect
// recvcounts[r] of them at recv + rdispls[r]. Every step sends one message, empty ones
// included, so that each rank knows how many messages to wait for. With c->check_args on, the
// ranks first exchange their send counts (one small uncounted MPI_Alltoall, like
// comm_check_args) so that a recvcount that disagrees with the sender's is reported by name;
// without it the transport's size check (comm_check_received) still catches it.
#pragma once

#include <vector>
#include "ring.h"

static inline bool alltoall_is_pow2(int p) { return (p & (p - 1)) == 0; }

// peers of rank r at step s (1 <= s < p)
static inline int alltoall_send_peer(int r, int s, int p) { return alltoall_is_pow2(p) ? (r ^ s) : ring_mod(r + s, p); }
static inline int alltoall_recv_peer(int r, int s, int p) { return alltoall_is_pow2(p) ? (r ^ s) : ring_mod(r - s, p); }

// count elements per pair of ranks; in place: send == recv
static inline void alltoall_pairwise(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "alltoall_pairwise", count, t, COMM_SUM, 0);
    int p = c->size, r = c->rank;
    if (count == 0) { return; }
    // in place, a block we still have to send could be overwritten by one we receive: send from a copy
    void* copy = NULL;
    if (send == recv) {
        copy = comm_scratch(c, count * p, t);
        comm_copy(c, copy, send, count * p, t);
        send = copy;
    }
    comm_copy(c, comm_at(recv, (size_t)r * count, t), comm_at(send, (size_t)r * count, t), count, t);
    for (int s = 1; s < p; s++) {
        int dst = alltoall_send_peer(r, s, p), src = alltoall_recv_peer(r, s, p);
        comm_sendrecv(c, comm_at(send, (size_t)dst * count, t), count, dst,
                      comm_at(recv, (size_t)src * count, t), count, src, t);
    }
    comm_scratch_free(c, copy);
}

// per-peer counts and element offsets, as alltoallv_native; out of place only
static inline void alltoallv_pairwise(Comm* c, const void* send, const size_t* sendcounts, const size_t* sdispls,
                                      void* recv, const size_t* recvcounts, const size_t* rdispls, CommType t) {
    int p = c->size, r = c->rank;
    if (send == recv) { comm_die(c, "alltoallv_pairwise", "send and recv must be different buffers"); }
    if (sendcounts[r] != recvcounts[r]) {
        comm_die(c, "alltoallv_pairwise", "this rank sends itself %zu elements but expects %zu", sendcounts[r], recvcounts[r]);
    }
    if (c->check_args && p > 1) {
        std::vector<unsigned long long> mine(p), theirs(p);
        for (int j = 0; j < p; j++) { mine[j] = sendcounts[j]; }
        MPI_Alltoall(mine.data(), 1, MPI_UNSIGNED_LONG_LONG, theirs.data(), 1, MPI_UNSIGNED_LONG_LONG, c->mpi);
        for (int j = 0; j < p; j++) {
            if (theirs[j] != recvcounts[j]) {
                comm_die(c, "alltoallv_pairwise", "rank %d sends %llu elements to this rank, which expects %zu",
                         j, theirs[j], recvcounts[j]);
            }
        }
    }
    comm_copy(c, comm_at(recv, rdispls[r], t), comm_at(send, sdispls[r], t), sendcounts[r], t);
    for (int s = 1; s < p; s++) {
        int dst = alltoall_send_peer(r, s, p), src = alltoall_recv_peer(r, s, p);
        comm_sendrecv(c, comm_at(send, sdispls[dst], t), sendcounts[dst], dst,
                      comm_at(recv, rdispls[src], t), recvcounts[src], src, t);
    }
}

// --- what each rank sends (bytes, messages)

static inline CommVolume alltoall_pairwise_volume(size_t count, CommType t, int p, int r) {
    (void)r;
    if (count == 0 || p == 1) { return {0, 0}; }
    return {(uint64_t)(p - 1) * count * comm_type_size(t), (uint64_t)(p - 1)};
}
static inline CommVolume alltoallv_pairwise_volume(const size_t* sendcounts, CommType t, int p, int r) {
    uint64_t n = 0;
    for (int j = 0; j < p; j++) { n += j == r ? 0 : sendcounts[j]; }
    return {n * comm_type_size(t), (uint64_t)(p - 1)};
}
