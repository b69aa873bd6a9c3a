// ZeRO++ (Wang et al., 2023): ZeRO-3 (dp_zero3.h) with less traffic, by three changes to its
// collectives, each behind its own flag (with --zero 3):
//
//   per block and micro-step   ZeRO-3                      ZeRO++
//   forward  all-gather        N ranks, a bytes/value      --qwz: int8 codes + an fp32 scale per 256 values
//   backward all-gather        N ranks, a bytes/value      --hpz G: inside a group of G ranks ("a node"), from a
//                                                          secondary copy kept since the forward (--qwz alone: int8)
//   gradient reduce-scatter    N ranks, a bytes/value      --qgz B: B-bit codes + scales over an all-to-all
//
// qwZ. Each rank quantises its shard of the block (llmc/cpu/quantize.h: blocks of 256 values,
//   symmetric, scale = absmax / 127), all-gathers the codes and scales, and dequantises all N
//   pieces, its own included, so every rank computes with the same weights. Only the
//   communicated copy is quantised: the shard and the master weights stay exact, so do the
//   checkpoints (evaluation and saving gather exactly: zero3_materialize).
//       |w - w'| <= absmax_block / 254 per element
// hpZ. The ranks of the dp group form groups of G consecutive ranks (MPI_Comm_split). After
//   the forward's all-gather of block l, group rank g keeps the slice [g P/G, (g+1) P/G) of it
//   (P: the padded block) until the backward of block l gathers it again within the group:
//
//   N = 4, G = 2, groups {0,1} {2,3}; the block's primary shards s0..s3 (rank r owns s_r)
//     forward   all-gather over 0..3            every rank: | s0 | s1 | s2 | s3 |
//               keep the group's half            ranks 0, 2: | s0 | s1 |   ranks 1, 3: | s2 | s3 |
//     backward  all-gather within {0,1}, {2,3}   every rank: | s0 s1 | s2 s3 |
//   The weights are the same bits as ZeRO-3's (with --qwz: the forward's dequantised ones), so
//   --hpz alone gives ZeRO-3's run bit for bit. G = N: the secondary slice is the primary shard
//   and the backward gathers over all N as ZeRO-3 does (on a second communicator); G = 1: each
//   rank keeps whole blocks from forward to backward, which then gathers nothing.
//   The root (wte, wpe, lnf) is gathered once per micro-step anyway: it has no secondary copy.
// qgZ. The gradient bucket of a block (its N shard pieces) is quantised piece by piece to B bits
//   (8 or 4), an all-to-all sends piece j to rank j, and rank j dequantises the N pieces it got
//   and sums them in fp32 in rank order (deterministic), then adds the mean into its gradient
//   shard. One hop over all N ranks (ZeRO++ does it in two: within the node, then across).
//       |g_r - g_r'| <= absmax_block / (2 qmax) per element and rank (qmax 127 or 7)
//
// Cost, per micro-step (the exact bytes, what is printed and the error bounds' report:
// dp_zeropp_accounting.h): qwZ sends ~(N-1)/N Psi (1 + 4/256) bytes per all-gather instead of
// (N-1)/N a Psi; hpZ's backward all-gather stays inside its group, ~(G-1)/G a Psi; qgZ sends
// ~(N-1)/N Psi (B/8 + 4/256) for the gradients. hpZ keeps a Psi / G more per rank.
//
// ZeRO++ plugs into ZeRO-3 as a mode of its own, chosen when any of its flags is given:
// ZeRO-3's table with this file's init (zeropp_init: ZeRO-3's, then its gather in
// dp->gather_params, then its buffers), its reduce-scatter as bucket_ready, its zero_grad and
// its formulas (DP_MODE_ZEROPP sits at the end of dp_zeropp_accounting.h, beside the formulas).
#pragma once

#include <algorithm>
#include <vector>
#include "dp_zero3.h"
#include "../comm/alltoall.h"

enum { ZPP_QWZ, ZPP_HPZ, ZPP_QGZ, ZPP_NCOLL };
static const char* ZPP_NAMES[ZPP_NCOLL] = {"qwZ all-gather", "hpZ group all-gather", "qgZ all-to-all"};

typedef struct ZeroPP {
    DataParallel* dp;
    int qwz, hpz, qgz;                 // the flags: on/off, ranks per group (0: off), bits (0: off)
    Comm group;                        // hpZ: the hpz consecutive ranks of dp->comm that hold this rank
    std::vector<floatX*> secondary;    // hpZ, per bucket (the root's: NULL): group rank g's slice P/G of the block
    size_t secondary_bytes;
    int32_t* wire;                     // qwZ: the all-gathered codes; qgZ: the codes sent
    int32_t* wire_recv;                // qgZ: the codes received
    float* acc;                        // qgZ: fp32 sums of one shard
    size_t wire_bytes, wire_recv_bytes, acc_bytes;
    float* stats;                      // device float[6]: weights (absmax, error energy, error 1-norm), gradients (the same)
    BackendEvent ready;                // marks the compute stream's work before a collective reads it
    uint64_t bytes[ZPP_NCOLL];         // sent this step, per collective
} ZeroPP;

// The ZeRO++ state of a DataParallel (NULL: plain ZeRO-3)
static inline ZeroPP* zeropp_of(const DataParallel* dp) { return dp->zeropp; }
static inline int zeropp_root_bucket(const DataParallel* dp) {
    return dp->root_unit >= 0 ? dp->unit_bucket[dp->root_unit] : -1;
}

// Collective over dp->comm, before ZeRO-3 lays out its buckets: the checks every rank makes
// (so every rank reports them) and hpZ's group.
static inline void zeropp_create(DataParallel* dp, int qwz, int hpz, int qgz) {
    if (!qwz && !hpz && !qgz) { return; }
    if (hpz > 0 && dp->N % hpz != 0) {
        die("--hpz %d does not divide the %d data-parallel ranks: hpZ's groups (nodes) are %d consecutive ranks of them",
            hpz, dp->N, hpz);
    }
    ZeroPP* z = new ZeroPP();
    z->dp = dp;
    z->qwz = qwz;
    z->hpz = hpz;
    z->qgz = qgz;
    if (hpz > 0) { z->group = comm_split(dp->comm, dp->rank / hpz, dp->rank % hpz, "hpz"); }
    z->ready = backend_event_create();
    dp->zeropp = z;
}

// After ZeRO-3's buckets exist: the secondary copies (parameters), the wire buffers (comm buffers).
static inline void zeropp_alloc(DataParallel* dp) {
    ZeroPP* z = zeropp_of(dp);
    if (!z) { return; }
    size_t max_shard = 0;
    int root = zeropp_root_bucket(dp);
    z->secondary.assign(dp->buckets.size(), NULL);
    z->secondary_bytes = 0;
    for (size_t b = 0; b < dp->buckets.size(); b++) {
        max_shard = std::max(max_shard, dp->buckets[b].shard);
        if (z->hpz > 0 && (int)b != root) {
            size_t bytes = dp->buckets[b].padded / z->hpz * sizeof(floatX);
            z->secondary[b] = (floatX*)dp_alloc(dp, MEM_PARAMS, bytes);
            z->secondary_bytes += bytes;
        }
    }
    z->wire_bytes = (size_t)dp->N * quant_words(max_shard, 8) * sizeof(int32_t);   // the larger of qwZ's and qgZ's
    z->wire = (int32_t*)dp_alloc(dp, MEM_COMM, z->wire_bytes);
    z->wire_recv_bytes = z->qgz ? (size_t)dp->N * quant_words(max_shard, z->qgz) * sizeof(int32_t) : 0;
    z->wire_recv = z->qgz ? (int32_t*)dp_alloc(dp, MEM_COMM, z->wire_recv_bytes) : NULL;
    z->acc_bytes = z->qgz ? max_shard * sizeof(float) : 0;
    z->acc = z->qgz ? (float*)dp_alloc(dp, MEM_COMM, z->acc_bytes) : NULL;
    z->stats = (float*)dp_alloc(dp, MEM_COMM, 6 * sizeof(float));
    device_memset_zero(z->stats, 6 * sizeof(float));
}

static inline void zeropp_free(DataParallel* dp) {
    ZeroPP* z = zeropp_of(dp);
    if (!z) { return; }
    for (floatX* s : z->secondary) { device_free(s); }
    device_free(z->wire);
    if (z->wire_recv) { device_free(z->wire_recv); }
    if (z->acc) { device_free(z->acc); }
    device_free(z->stats);
    backend_event_destroy(z->ready);
    if (z->hpz > 0) { comm_free(&z->group); }
    dp->zeropp = NULL;
    delete z;
}


// the compute stream's work so far (quantising, copies) comes before c's next collective
static inline void zeropp_comm_ready(ZeroPP* z, Comm* c) {
    backend_event_record(z->ready);
    comm_wait_event(c, z->ready);
}

static inline void zeropp_allgather(DataParallel* dp, Comm* c, void* buf, size_t count, CommType t) {
    void* mine = comm_at(buf, comm_block_offset(count, c->size, c->rank), t);
    if (dp->use_ring) { allgather_ring(c, mine, buf, count, t); }
    else { allgather_native(c, mine, buf, count, t); }
}

// --- the collectives (run on the communication thread, inside ZeRO-3's tasks)

// qwZ: the block's parameters into full (padded values), all-gathered as int8 blocks; the
// forward's gather adds the quantisation error's statistics
static inline void zeropp_gather_quantized(ZeroPP* z, const Bucket* bk, floatX* full, int forward) {
    DataParallel* dp = z->dp;
    Comm* c = dp->comm;
    size_t W = quant_words(bk->shard, 8);
    quantize_blocks(z->wire + (size_t)dp->rank * W, bk->param_shard, bk->shard, 8, forward ? z->stats : NULL);
    zeropp_comm_ready(z, c);
    uint64_t before = c->bytes_sent;
    zeropp_allgather(dp, c, z->wire, (size_t)dp->N * W, COMM_INT32);
    z->bytes[ZPP_QWZ] += c->bytes_sent - before;
    for (int j = 0; j < dp->N; j++) { dequantize_blocks(full + (size_t)j * bk->shard, z->wire + (size_t)j * W, bk->shard, 8); }
}

// hpZ, after the forward's gather of block bucket b into full: this rank's slice of its group's partition
static inline void zeropp_keep_secondary(ZeroPP* z, int b, const floatX* full) {
    const Bucket* bk = &z->dp->buckets[b];
    size_t part = bk->padded / z->hpz;
    copy_device_to_device(z->secondary[b], full + (size_t)z->group.rank * part, part * sizeof(floatX));
}

// hpZ, in the backward: the block again, from the group's secondary slices, without leaving the group
static inline void zeropp_gather_secondary(ZeroPP* z, int b, floatX* full) {
    const Bucket* bk = &z->dp->buckets[b];
    size_t part = bk->padded / z->hpz;
    copy_device_to_device(full + (size_t)z->group.rank * part, z->secondary[b], part * sizeof(floatX));
    zeropp_comm_ready(z, &z->group);
    uint64_t before = z->group.bytes_sent;
    zeropp_allgather(z->dp, &z->group, full, bk->padded, COMM_FLOATX);
    z->bytes[ZPP_HPZ] += z->group.bytes_sent - before;
}

// qgZ: the bucket's gradients buf (N pieces of a shard) reduced into this rank's gradient shard:
// quantise each piece, all-to-all, dequantise and add up the N pieces in rank order, add the mean
static inline void zeropp_reduce_scatter(ZeroPP* z, Bucket* bk, const floatX* buf) {
    DataParallel* dp = z->dp;
    Comm* c = dp->comm;
    int bits = z->qgz;
    size_t W = quant_words(bk->shard, bits);
    for (int j = 0; j < dp->N; j++) {
        quantize_blocks(z->wire + (size_t)j * W, buf + (size_t)j * bk->shard, bk->shard, bits, z->stats + 3);
    }
    zeropp_comm_ready(z, c);
    uint64_t before = c->bytes_sent;
    if (dp->use_ring) { alltoall_pairwise(c, z->wire, z->wire_recv, W, COMM_INT32); }
    else { alltoall_native(c, z->wire, z->wire_recv, W, COMM_INT32); }
    z->bytes[ZPP_QGZ] += c->bytes_sent - before;
    device_memset_zero(z->acc, bk->shard * sizeof(float));
    for (int j = 0; j < dp->N; j++) { dequantize_accumulate(z->acc, z->wire_recv + (size_t)j * W, bk->shard, bits); }
    quant_add_mean(bk->grad_shard, z->acc, bk->shard, dp->N);
}

// --- ZeRO-3's collectives, ZeRO++'s way (the entries of DP_MODE_ZEROPP)

// dp->gather_params: the backward's gather of a block from the group's secondary copy (hpZ), the
// other training gathers quantised (qwZ) or plain; after the forward's, hpZ keeps its slice.
// Evaluation and checkpoints (ZERO3_EXACT) gather exactly.
static inline long zeropp_gather_params(DataParallel* dp, int b, int who, floatX* full) {
    Bucket* bk = &dp->buckets[b];
    ZeroPP* z = who == ZERO3_EXACT ? NULL : zeropp_of(dp);
    int block = b != zeropp_root_bucket(dp);
    int from_secondary = z && z->hpz && block && who == ZERO3_BACKWARD;   // hpZ: within the group
    int quantized = z && z->qwz && !from_secondary;                       // qwZ: int8 over all ranks
    int keep_secondary = z && z->hpz && block && who == ZERO3_FORWARD;
    char name[64];
    snprintf(name, sizeof(name), "all-gather params %d%s", b, from_secondary ? " (hpZ group)" : quantized ? " (int8)" : "");
    return dp_enqueue(dp, name, [dp, bk, full, z, b, who, from_secondary, quantized, keep_secondary] {
        if (from_secondary) {
            zeropp_gather_secondary(z, b, full);
        } else if (quantized) {
            zeropp_gather_quantized(z, bk, full, who == ZERO3_FORWARD);
        } else {
            zero3_allgather_shards(dp, bk, full);
        }
        if (keep_secondary) { zeropp_keep_secondary(z, b, full); }
    });
}

// bucket_ready: ZeRO-2's reduce-scatter, or with --qgz the quantised one, handed to the
// communication thread the same way
static inline void zeropp_reduce_scatter_bucket(DataParallel* dp, int b) {
    ZeroPP* z = zeropp_of(dp);
    if (!z->qgz) { zero2_reduce_scatter_bucket(dp, b); return; }
    Bucket* bk = &dp->buckets[b];
    char name[64];
    snprintf(name, sizeof(name), "reduce-scatter bucket %d (int%d all-to-all)", b, z->qgz);
    floatX* buf = bk->grad;
    bk->grad = NULL;
    bk->reduce_ticket = dp_enqueue(dp, name, [dp, bk, buf, z] {
        zeropp_reduce_scatter(z, bk, buf);
        dp_give(dp, MEM_GRADS, buf, bk->padded);
    });
    dp->in_flight.push_back(bk->reduce_ticket);
}

// ZeRO-3's set-up, then this gather in its place and the secondary copies and wire buffers
static inline void zeropp_init(DataParallel* dp) {
    zero3_init(dp);
    dp->gather_params = zeropp_gather_params;
    zeropp_alloc(dp);
}

// per step: ZeRO-3's gradient shards, and the counters and statistics start again
static inline void zeropp_zero_grad(DataParallel* dp) {
    buckets_zero_grad(dp);
    ZeroPP* z = zeropp_of(dp);
    for (int i = 0; i < ZPP_NCOLL; i++) { z->bytes[i] = 0; }
    device_memset_zero(z->stats, 6 * sizeof(float));
}
