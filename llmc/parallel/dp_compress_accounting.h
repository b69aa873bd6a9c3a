// Gradient compression's accounting (dp_compress.h has the mechanism): the bytes a step sends
// against the uncompressed collectives, the host buffers, the plan printed at start and the
// checks printed under each step.
//
// Bytes this rank sends per step (P_b = payload bytes of bucket b, as compress_codec.h gives them):
//   all-reduce (ring all-gather of the payloads)   (N-1) sum_b P_b
//        against the uncompressed ring all-reduce   2 (N-1)/N a Psi
//   push (to the S servers but itself)             sum_{s != r} P_s     (+ the pull, a Psi_s (N-1) on a server)
//        against the uncompressed push              a Psi (minus the own slice)
// Per value of a bucket, the compressed all-gather beats the ring all-reduce when
//   topk 8 R (N-1) < 2a (N-1)/N: R < a/(4N)   randk R < a/(2N)   qsgd N < 16a/B   sign N < 16a
// The all-gather's traffic grows as (N-1) P while the ring's stays 2 (N-1)/N a Psi: the sparse
// methods lose their edge on many ranks (sparse supports differ per rank: no sum on the way).
#pragma once

#include <algorithm>
#include <math.h>
#include "dp_compress.h"

// bytes this rank sends per step (the pull of parameters, uncompressed, included)
static inline uint64_t compress_formula_bytes(const DataParallel* dp) {
    const DPCompress* c = dp->compress;
    uint64_t bytes = 0;
    if (c->ps) {
        int r = dp->rank, S = dp->ps_servers;
        for (int s = 0; s < S; s++) {
            if (s != r) { bytes += 4 * cmp_payload_words(&c->spec, c->buckets[s].n); }
        }
        if (r < S) { bytes += (uint64_t)(dp->N - 1) * c->buckets[r].n * sizeof(floatX); }
        return bytes;
    }
    for (const CmpBucket& b : c->buckets) { bytes += (uint64_t)(dp->N - 1) * 4 * cmp_payload_words(&c->spec, b.n); }
    return bytes;
}
// what the same buckets cost uncompressed (the ring all-reduce, or push + pull)
static inline uint64_t compress_plain_bytes(const DataParallel* dp) {
    const DPCompress* c = dp->compress;
    if (c->ps) { return allreduce_parameter_server_volume(dp->psi, COMM_FLOATX, dp->N, dp->rank, dp->ps_servers).bytes; }
    uint64_t bytes = 0;
    for (const CmpBucket& b : c->buckets) { bytes += allreduce_ring_volume(b.n, COMM_FLOATX, dp->N, dp->rank).bytes; }
    return bytes;
}

static inline void compress_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    if (dp->compress) { out[MEM_COMM] += cmp_host_bytes(dp->compress, dp->N, dp->ps_servers); }
}

static inline void compress_print_plan(const DataParallel* dp) {
    const DPCompress* c = dp->compress;
    if (!c) { return; }
    const CompressSpec* s = &c->spec;
    char what[96];
    if (cmp_sparse(s)) {
        snprintf(what, sizeof(what), "%s:%g, k = ceil(R n) values%s", CMP_NAMES[s->method], s->ratio,
                 s->method == CMP_TOPK ? " + int32 indices" : " (indices from a shared seed)");
    } else if (s->method == CMP_QSGD) {
        snprintf(what, sizeof(what), "qsgd:%d, %d levels of a power-of-two step per bucket", s->bits, cmp_levels(s->bits));
    } else {
        snprintf(what, sizeof(what), "sign, 1 bit per value + scale mean|a| per bucket");
    }
    printf("compress     %s | error feedback %s | %zu bucket(s) (%s) | host buffers %.3f MiB, in comm buffers\n", what,
           c->error_feedback ? "on" : "off", c->buckets.size(), c->ps ? "server slices: push" : "all-gather of payloads",
           c->host_bytes / 1048576.0);
    printf("compress     this rank sends %llu B per step (formula), uncompressed %llu B: %.4fx\n",
           (unsigned long long)compress_formula_bytes(dp), (unsigned long long)compress_plain_bytes(dp),
           (double)compress_formula_bytes(dp) / std::max((uint64_t)1, compress_plain_bytes(dp)));
}

// Under the step's comm line: every rank's bytes against the formula, the conservation check
// summed over the ranks, the relative compression error.
static inline void compress_report_step(DataParallel* dp, uint64_t sent, uint64_t want) {
    DPCompress* c = dp->compress;
    if (!c) { return; }
    double v[6] = {(double)c->values, (double)c->conserved, (double)c->guarded, c->err2, c->norm2,
                   (double)(sent == want)};
    double mx = c->max_err;
    MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_DOUBLE, MPI_SUM, dp->comm->mpi);   // small, not counted
    MPI_Allreduce(MPI_IN_PLACE, &v[5], 1, MPI_DOUBLE, MPI_MIN, dp->comm->mpi);
    MPI_Allreduce(MPI_IN_PLACE, &mx, 1, MPI_DOUBLE, MPI_MAX, dp->comm->mpi);
    printf(" compress | %s", dp->use_ring || c->ps ? (v[5] == 1.0 ? "bytes = formula on all ranks" : "bytes DIFFERENT from the formula on some rank")
                                                    : "native all-gather: bytes not counted");
    printf(" | relative error ||a - d|| / ||a|| = %.4f", v[4] > 0 ? sqrt(v[3] / v[4]) : 0.0);
    unsigned long long n = (unsigned long long)v[0], ok = (unsigned long long)v[1];
    if (!c->error_feedback) {
        printf(" | error feedback off\n");
    } else if (!cmp_exact(&c->spec)) {
        if (ok == n) {
            printf(" | error feedback: residual = fl(accumulated - sent), |accumulated - (sent + residual)| <= ulp(residual)/2 "
                   "on all %llu values (largest %.3e)\n", n, mx);
        } else {
            printf(" | error feedback: CONSERVATION FAILED on %llu of %llu values\n", n - ok, n);
        }
    } else if (ok == n) {
        printf(" | error feedback: sent + residual = accumulated exactly on all %llu values", n);
        if (c->spec.method == CMP_QSGD) { printf(" (%.0f rounded down by the guard)", v[2]); }
        printf("\n");
    } else {
        printf(" | error feedback: CONSERVATION FAILED on %llu of %llu values\n", n - ok, n);
    }
    c->values = c->conserved = c->guarded = 0;
    c->err2 = c->norm2 = 0.0;
    c->max_err = 0.0f;
}
