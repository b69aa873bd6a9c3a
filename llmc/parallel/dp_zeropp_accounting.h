// ZeRO++'s accounting (dp_zeropp.h has the mechanism): the bytes its collectives send, the
// memory hpZ's secondary copy takes, the plan printed at start, and the line under each step
// (bytes per collective against the formula, the quantisation error's bounds); and its mode's
// table, which names these formulas.
//
// Bytes this rank sends per micro-step (our ring all-gather and pairwise all-to-all; P_b the
// padded bucket, S_b = P_b / N the shard, nb(S) = ceil(S / 256) quantisation blocks; sums over
// the blocks' buckets, the root's bucket joins the forward and the reduce-scatter):
//   qwZ all-gather   (N-1) nb(S_b) (256 + 4)         per gather   ~ (N-1)/N Psi (1 + 4/256)
//                    instead of (N-1) S_b a                            (a = 4 CPU fp32, 2 bf16)
//   hpZ all-gather   (G-1) (P_b / G) a               per block    ~ (G-1)/G Psi a, inside the group
//   qgZ all-to-all   (N-1) nb(S_b) (256 B/8 + 4)     per bucket   ~ (N-1)/N Psi (B/8 + 4/256)
// Memory: hpZ keeps sum over blocks of P_b / G values (a bytes each) per rank for the whole
// step: counted as parameters in the memory table. The wire buffers count as comm buffers.
#pragma once

#include <math.h>
#include "dp_zeropp.h"
#include "dp_accounting.h"

// --- what the lecture predicts: bytes per micro-step, per ZeRO++ collective (out) and in total
// (ZeRO-3's collectives that ZeRO++ leaves alone included)
static inline uint64_t zeropp_formula(const DataParallel* dp, const ZeroPP* z, uint64_t out[ZPP_NCOLL]) {
    uint64_t N = (uint64_t)dp->N, a = sizeof(floatX), total = 0;
    for (int i = 0; i < ZPP_NCOLL; i++) { out[i] = 0; }
    int root = zeropp_root_bucket(dp);
    for (size_t b = 0; b < dp->buckets.size(); b++) {
        const Bucket* bk = &dp->buckets[b];
        uint64_t plain = (N - 1) * bk->shard * a;                        // a ring pass of the bucket
        uint64_t ag_int8 = (N - 1) * quant_words(bk->shard, 8) * 4;     // qwZ
        uint64_t fwd = z->qwz ? ag_int8 : plain, bwd = 0, rs = plain;
        if ((int)b != root) {   // the root is gathered once; blocks again in the backward
            bwd = z->hpz ? (uint64_t)(z->hpz - 1) * (bk->padded / z->hpz) * a : fwd;
        }
        if (z->qgz) { rs = (N - 1) * quant_words(bk->shard, z->qgz) * 4; }
        if (z->qwz) { out[ZPP_QWZ] += fwd + (z->hpz ? 0 : bwd); }
        if (z->hpz) { out[ZPP_HPZ] += bwd; }
        if (z->qgz) { out[ZPP_QGZ] += rs; }
        total += fwd + bwd + rs;
    }
    return total;
}

// ZeRO-3's bytes per step with ZeRO++'s collectives (the hpZ group's bytes included)
static inline uint64_t zeropp_formula_bytes(const DataParallel* dp, int micro) {
    uint64_t per[ZPP_NCOLL];
    return (uint64_t)micro * zeropp_formula(dp, zeropp_of(dp), per);
}
// ZeRO-3's memory, and hpZ's secondary copy in the parameters: a / hpz of every block's padded bucket
static inline void zeropp_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    size_t a = sizeof(floatX);
    const ZeroPP* z = zeropp_of(dp);
    size_t secondary = 0;
    if (z->hpz) {
        size_t root = zero3_root_padded(dp);
        secondary = a * (dp->psi_pad - root) / z->hpz;   // every block's padded size is a multiple of N, so of hpz
    }
    zero3_formula_memory(dp, out);
    out[MEM_PARAMS] += secondary;
}

// bytes sent on the hpZ group's communicator this step (the step's total adds them to dp->comm's)
static inline uint64_t zeropp_group_bytes(const DataParallel* dp) {
    ZeroPP* z = zeropp_of(dp);
    return z ? z->bytes[ZPP_HPZ] : 0;
}

// --- printing: the plan at start, then a line per step under the comm line

static inline void zeropp_print_plan(const DataParallel* dp) {
    ZeroPP* z = zeropp_of(dp);
    if (!z) { return; }
    printf("zero++       qwZ %s | hpZ %s | qgZ %s | quantisation blocks of %d values, one fp32 scale each\n",
           z->qwz ? "on (weights all-gathered as int8)" : "off",
           z->hpz ? "on" : "off", z->qgz ? (z->qgz == 8 ? "on (int8 all-to-all)" : "on (int4 all-to-all)") : "off",
           QUANT_BLOCK);
    if (z->hpz) {
        printf("zero++       hpZ groups of %d consecutive dp ranks (this rank: group %d, rank %d in it); secondary copy "
               "%.3f MiB per rank, in the parameters row\n", z->hpz, dp->rank / z->hpz, z->group.rank,
               z->secondary_bytes / 1048576.0);
    }
}

// Measured against the formula, per collective; and what the quantisation error can be at most,
// from this step's scales (the bound the loss tolerance in doc/memory.md, ZeRO++ starts from).
static inline void zeropp_report_step(DataParallel* dp, int micro) {
    ZeroPP* z = zeropp_of(dp);
    if (!z) { return; }
    uint64_t want[ZPP_NCOLL];
    zeropp_formula(dp, z, want);
    int on[ZPP_NCOLL] = {z->qwz, z->hpz > 0, z->qgz > 0};
    printf("   zero++");
    for (int i = 0; i < ZPP_NCOLL; i++) {
        if (!on[i]) { continue; }
        uint64_t w = dp->N > 1 ? want[i] * (uint64_t)micro : 0, got = z->bytes[i];
        if (dp->use_ring) {
            printf(" | %s sent %llu B (formula %llu B, %s)", ZPP_NAMES[i], (unsigned long long)got,
                   (unsigned long long)w, got == w ? "equal" : "DIFFERENT");
        } else {
            printf(" | %s: native, not counted (formula %llu B)", ZPP_NAMES[i], (unsigned long long)w);
        }
    }
    printf("\n");
    if (!z->qwz && !z->qgz) { return; }
    float s[6];
    copy_device_to_host(s, z->stats, sizeof(s));
    double mx[2] = {s[0], s[3]}, sum[4] = {s[1], s[2], s[4], s[5]};
    MPI_Allreduce(MPI_IN_PLACE, mx, 2, MPI_DOUBLE, MPI_MAX, dp->comm->mpi);     // 48 bytes, not counted
    MPI_Allreduce(MPI_IN_PLACE, sum, 4, MPI_DOUBLE, MPI_SUM, dp->comm->mpi);
    printf("   zero++ error bounds");
    // weights: every rank quantised its shard once per forward; the pieces cover the model
    if (z->qwz) {
        printf(" | weights: block absmax <= %.6e, |dw| <= %.6e, ||dw||_2 <= %.6e, ||dw||_1 <= %.6e", mx[0], mx[0] / 254.0,
               sqrt(sum[0] / micro), sum[1] / micro);
    }
    // gradients: each rank quantised its whole bucket, and the mean of N errors is at most the
    // mean of their bounds: ||e||_2^2 <= energy / N (Jensen), ||e||_1 <= l1 / N, per micro-step;
    // the step's gradient adds its micro-steps' errors: ||sum e_m||_2^2 <= micro sum ||e_m||_2^2
    if (z->qgz) {
        int qmax = quant_qmax(z->qgz);
        printf(" | gradients (int%d): block absmax <= %.6e, |dg| <= %.6e, ||dg||_2 <= %.6e, ||dg||_1 <= %.6e", z->qgz,
               mx[1], mx[1] / (2.0 * qmax), sqrt(micro * sum[2] / dp->N), sum[3] / dp->N);
    }
    printf("\n");
}

// ZeRO-3 with ZeRO++'s collectives (dp_zeropp.h) and the formulas above; dp.h picks it when
// --qwz, --hpz or --qgz is given
static const DPModeOps DP_MODE_ZEROPP = {
    "ZeRO-3", "ddp", 3,   // name, --dp-mode, --zero
    1, 0, "",             // reduce_every_micro, always_counted, comm_note
    zeropp_init, zeropp_zero_grad, zero3_update,
    zeropp_reduce_scatter_bucket,   // (called by ZeRO-3's hooks)
    zero3_materialize, zero3_dematerialize,
    zeropp_formula_bytes, zeropp_formula_memory,
    1,                    // owners_disjoint
};
