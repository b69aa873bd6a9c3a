// Bruck's algorithms: ceil(log2 p) steps for any p (no fold-in as in recursive.h). At step k
// every rank sends to r - 2^k and receives from r + 2^k (all-gather), or the reverse
// (all-to-all). Both work on a copy of the data rotated so that the rank's own block comes
// first, and undo the rotation at the end.
//
// All-gather, p = 5, blocks A..E (rank r starts with block r; w = the rotated work buffer,
// position i holds block r+i). At step k a rank sends its first min(2^k, p - 2^k) positions
// and appends those of rank r + 2^k behind its own:
//   start:   r0 w = A        r1 w = B        ...  r4 w = E
//   step 0:  r0 w = AB       r1 w = BC       ...  r4 w = EA       (1 block from r+1)
//   step 1:  r0 w = ABCD     r1 w = BCDE     ...  r4 w = EABC     (2 blocks from r+2)
//   step 2:  r0 w = ABCDE    r1 w = BCDEA    ...  r4 w = EABCD    (1 block from r+4)
//   then rotate: recv block (r + i) mod p = w[i]
// With uneven blocks of the balanced split the positions have different sizes, but the
// positions a rank sends are always contiguous in both its w and the receiver's.
//
// All-to-all, the rank's p blocks of n elements: rotate so that w[i] is the block for rank
// r + i. At step k send every w[i] whose index i has bit k set to rank r + 2^k (packed into
// one message), which stores them at the same positions. A block for rank r + i thus travels
// 2^k for every bit k of i and arrives after log2 p steps; then w[i] at rank r holds the block
// from rank r - i, and the inverse rotation puts it at recv block (r - i) mod p.
//   p = 4: step 0 sends positions 1, 3 to r+1; step 1 sends positions 2, 3 to r+2.
//
// Cost (S = bytes of the full all-gather buffer; n = bytes per pair in all-to-all):
//   all-gather:  ceil(log2 p) alpha + (p-1)/p S beta    (the ring's bytes in log p messages)
//   all-to-all:  ceil(log2 p) alpha + about (p/2) log2(p) n beta   (vs pairwise (p-1) alpha +
//                (p-1) n beta: fewer messages, more bytes: it wins for small n)
#pragma once

#include <vector>
#include "transport.h"

// element offset of each rotated position of the all-gather: pos[i] = start of block (r+i) mod p
static inline std::vector<size_t> bruck_positions(size_t count, int p, int r) {
    std::vector<size_t> pos(p + 1);
    pos[0] = 0;
    for (int i = 0; i < p; i++) { pos[i + 1] = pos[i] + comm_block_count(count, p, (r + i) % p); }
    return pos;
}

// count = full size, balanced blocks; in place: send == recv + offset(rank)
static inline void allgather_bruck(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "allgather_bruck", count, t, COMM_SUM, 0);
    int p = c->size, r = c->rank;
    if (count == 0) { return; }
    std::vector<size_t> mine = bruck_positions(count, p, r);
    void* w = comm_scratch(c, count, t);
    comm_copy(c, w, send, mine[1], t);
    for (int d = 1; d < p; d *= 2) {
        int n = d < p - d ? d : p - d;                           // positions this step moves
        int dst = (r - d + p) % p, src = (r + d) % p;
        // the sender's first n positions, i.e. blocks src .. src+n-1, land at our positions d..d+n-1
        comm_sendrecv(c, w, mine[n], dst, comm_at(w, mine[d], t), mine[d + n] - mine[d], src, t);
    }
    // rotate back: w = blocks r .. p-1 then 0 .. r-1
    size_t off = comm_block_offset(count, p, r);
    comm_copy(c, comm_at(recv, off, t), w, count - off, t);
    comm_copy(c, recv, comm_at(w, count - off, t), off, t);
    comm_scratch_free(c, w);
}

// count elements per pair; in place: send == recv
static inline void alltoall_bruck(Comm* c, const void* send, void* recv, size_t count, CommType t) {
    comm_check_args(c, "alltoall_bruck", count, t, COMM_SUM, 0);
    int p = c->size, r = c->rank;
    if (count == 0) { return; }
    void* w = comm_scratch(c, count * p, t);
    // a step moves the positions with one bit set: at most half of them, rounded up
    void* pack = comm_scratch(c, count * ((p + 1) / 2), t);
    void* unpack = comm_scratch(c, count * ((p + 1) / 2), t);
    for (int i = 0; i < p; i++) {                            // w[i] = the block for rank r + i
        comm_copy(c, comm_at(w, (size_t)i * count, t), comm_at(send, (size_t)((r + i) % p) * count, t), count, t);
    }
    for (int d = 1; d < p; d *= 2) {
        size_t n = 0;
        for (int i = d; i < p; i++) {
            if (i & d) { comm_copy(c, comm_at(pack, n * count, t), comm_at(w, (size_t)i * count, t), count, t); n++; }
        }
        comm_sendrecv(c, pack, n * count, (r + d) % p, unpack, n * count, (r - d + p) % p, t);
        n = 0;
        for (int i = d; i < p; i++) {
            if (i & d) { comm_copy(c, comm_at(w, (size_t)i * count, t), comm_at(unpack, n * count, t), count, t); n++; }
        }
    }
    for (int i = 0; i < p; i++) {                            // w[i] came from rank r - i
        comm_copy(c, comm_at(recv, (size_t)((r - i + p) % p) * count, t), comm_at(w, (size_t)i * count, t), count, t);
    }
    comm_scratch_free(c, w);
    comm_scratch_free(c, pack);
    comm_scratch_free(c, unpack);
}

// --- what each rank sends (bytes, messages)

static inline CommVolume allgather_bruck_volume(size_t count, CommType t, int p, int r) {
    if (count == 0 || p == 1) { return {0, 0}; }
    std::vector<size_t> pos = bruck_positions(count, p, r);
    uint64_t n = 0, msgs = 0;
    for (int d = 1; d < p; d *= 2) { n += pos[d < p - d ? d : p - d]; msgs++; }
    return {n * comm_type_size(t), msgs};
}
static inline CommVolume alltoall_bruck_volume(size_t count, CommType t, int p, int r) {
    (void)r;
    if (count == 0 || p == 1) { return {0, 0}; }
    uint64_t blocks = 0, msgs = 0;
    for (int d = 1; d < p; d *= 2) {
        for (int i = d; i < p; i++) { blocks += (i & d) != 0; }
        msgs++;
    }
    return {blocks * count * comm_type_size(t), msgs};
}
