// Gradient compression (--compress topk:R | randk:R | qsgd:B | sign, --error-feedback on|off):
// each rank sends a compressed copy C(a) of its gradient bucket instead of the bucket, for the
// data-parallel all-reduce (--dp-mode naive: one bucket, the flat buffer; --dp-mode ddp --zero 0:
// one per DDP bucket) and for the parameter server's push (--dp-mode ps: a bucket per server
// slice; the pull of parameters is not compressed).
//
//   all-reduce of a bucket of n values, N ranks          parameter-server push, S servers
//     a_r = g_r + e_r        (error feedback)              a_r = g_r + e_r per slice s
//     P_r = C(a_r)           (the payload, words)          P_r,s = C(a_r,s)
//     all-gather P_0 .. P_{N-1}  (ring, counted)           worker r -> server s: P_r,s (s != r)
//     every rank: sum_j D(P_j) / N                         server s: sum_j D(P_j,s) / N
//     e_r = a_r - D(P_r)     (kept for the next step)      e_r,s = a_r,s - D(P_r,s)
//
// The cost: the all-gather sends (N-1) payloads per bucket where the ring all-reduce sends
// 2 (N-1)/N of the bucket; the formulas and what a step prints: dp_compress_accounting.h. The
// methods, their payloads and error feedback: compress_codec.h.
//
// The sum. Ratio 1 (topk:1, randk:1) must give the uncompressed run bit for bit: the decoded
// values are added in exactly the order allreduce_ring (comm/ring.h) adds them, block b of the
// balanced split as ((d_{b+1} + d_{b+2}) + ...) + d_b, with comm_reduce_local and
// comm_avg_finish, and for the push in ps_push's order (comm/ps.h): ((d_s + d_{s-1}) + ...).
//
// Backends: the codec runs on the host, on fp32 copies (a staged wire: the device's floatX
// gradients are copied and widened to the host, the sum goes back narrowed). On CUDA the sum is
// fp32 (the uncompressed bf16 ring rounds after every addition), so only the CPU build's fp32
// run is compared bit for bit. Host buffers: residuals (4 sum_b n_b), two work arrays of the
// largest bucket, the wire and the sparse methods' index arrays, counted in "comm buffers".
#pragma once

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <vector>
#include "compress_codec.h"
#include "dp_mode.h"
#include "../comm/ps.h"

// ---------------------------------------------------------------------------------------
// The data-parallel side: a bucket per all-reduce call or server slice, its residual

typedef struct {
    floatX* grad;         // the bucket's gradients (device), as dp_allreduce_avg / the push see them
    size_t n;
    float* residual;      // host, n values (error feedback on; NULL off)
    uint64_t calls;       // how many times it was compressed: the step, for the seeds
} CmpBucket;

typedef struct DPCompress {
    CompressSpec spec;
    int error_feedback;
    int ps;                       // 1: the parameter server's push; 0: the all-reduce
    std::vector<CmpBucket> buckets;
    size_t nmax, pmax;            // largest bucket, its payload words
    float *a, *dec;               // host work: the values sent (a = g + e), then the sum; decoded values
    uint32_t* wire;               // all-reduce: N payloads; push: S payloads out, one in
    uint32_t *idx, *scratch;      // the sparse methods' indices (k) and selection scratch (n)
    size_t host_bytes;            // all of the above, counted as comm buffers
    // this step's checks (reset by compress_report_step)
    uint64_t values, conserved, guarded;
    double err2, norm2;           // sum (a - d)^2, sum a^2
    float max_err;
} DPCompress;

// host bytes compress_create allocates (the formula: the same sizes, from the buckets)
static inline size_t cmp_host_bytes(const DPCompress* c, int N, int S) {
    size_t res = 0;
    for (const CmpBucket& b : c->buckets) { res += c->error_feedback ? b.n : 0; }
    size_t wire = (size_t)(c->ps ? S + 1 : N) * c->pmax;
    size_t sparse = cmp_sparse(&c->spec) ? cmp_k(&c->spec, c->nmax) + c->nmax : 0;
    return 4 * (res + 2 * c->nmax + wire + sparse);
}

static inline void* cmp_host_alloc(size_t bytes) {
    void* p = calloc(bytes ? bytes : 1, 1);
    if (!p) { die("--compress: out of host memory allocating %.1f MiB", bytes / 1048576.0); }
    return p;
}

// After the mode's init (its buckets exist): the buckets, residuals and wire buffers.
static inline void compress_create(DataParallel* dp, const char* spec, int error_feedback) {
    if (!spec || strcmp(spec, "none") == 0) { return; }
    DPCompress* c = new DPCompress();
    c->spec = compress_parse(spec);
    c->error_feedback = error_feedback;
    const char* mode = dp->ops->flag;
    c->ps = strcmp(mode, "ps") == 0;
    GPT2* m = dp->model;
    if (c->ps) {
        for (int s = 0; s < dp->ps_servers; s++) {
            c->buckets.push_back({m->grads_memory + comm_block_offset(dp->psi, dp->ps_servers, s),
                                  comm_block_count(dp->psi, dp->ps_servers, s), NULL, 0});
        }
    } else if (strcmp(mode, "naive") == 0) {
        c->buckets.push_back({m->grads_memory, dp->psi, NULL, 0});
    } else if (strcmp(mode, "ddp") == 0 && dp->ops->zero == 0) {
        for (const Bucket& b : dp->buckets) { c->buckets.push_back({b.grad, b.padded, NULL, 0}); }
    } else {
        die("--compress compresses the parameter server's push or the all-reduce (--dp-mode ps, naive or ddp): not --zero %d",
            dp->ops->zero);
    }
    c->nmax = c->pmax = 0;
    for (CmpBucket& b : c->buckets) {
        c->nmax = std::max(c->nmax, b.n);
        c->pmax = std::max(c->pmax, cmp_payload_words(&c->spec, b.n));
        if (error_feedback) {
            b.residual = (float*)cmp_host_alloc(b.n * sizeof(float));
            for (size_t i = 0; i < b.n; i++) { b.residual[i] = -0.0f; }
        }
    }
    c->a = (float*)cmp_host_alloc(c->nmax * sizeof(float));
    c->dec = (float*)cmp_host_alloc(c->nmax * sizeof(float));
    c->wire = (uint32_t*)cmp_host_alloc((size_t)(c->ps ? dp->ps_servers + 1 : dp->N) * c->pmax * sizeof(uint32_t));
    c->idx = cmp_sparse(&c->spec) ? (uint32_t*)cmp_host_alloc(cmp_k(&c->spec, c->nmax) * sizeof(uint32_t)) : NULL;
    c->scratch = cmp_sparse(&c->spec) ? (uint32_t*)cmp_host_alloc(c->nmax * sizeof(uint32_t)) : NULL;
    c->host_bytes = cmp_host_bytes(c, dp->N, dp->ps_servers);
    dp->mem_live[MEM_COMM] += c->host_bytes;
    dp->mem_peak[MEM_COMM] = std::max(dp->mem_peak[MEM_COMM], dp->mem_live[MEM_COMM]);
    dp->compress = c;
}

static inline void compress_free(DataParallel* dp) {
    DPCompress* c = dp->compress;
    if (!c) { return; }
    for (CmpBucket& b : c->buckets) { free(b.residual); }
    free(c->a);
    free(c->dec);
    free(c->wire);
    free(c->idx);
    free(c->scratch);
    dp->mem_live[MEM_COMM] -= c->host_bytes;
    delete c;
    dp->compress = NULL;
}

static inline CmpBucket* cmp_find(DPCompress* c, const floatX* grad, size_t n) {
    for (CmpBucket& b : c->buckets) {
        if (b.grad == grad && b.n == n) { return &b; }
    }
    die("--compress: no compression bucket for a buffer of %zu values (internal error)", n);
    return NULL;
}

// a = g + e of bucket b into c->a; compress it into out; the residual and the checks.
// Leaves D(C(a)) in c->dec.
static inline void cmp_compress_bucket(DataParallel* dp, DPCompress* c, CmpBucket* b, int id, uint32_t* out) {
    size_t n = b->n;
    copy_floats_to_host(c->a, b->grad, n);   // the staged wire: device floatX -> host fp32
    if (b->residual) {
        for (size_t i = 0; i < n; i++) { c->a[i] += b->residual[i]; }
    }
    uint64_t step = b->calls++;
    // randk: the same indices on every rank (rank 0 in the seed); qsgd: each rank its own draws
    uint64_t seed = cmp_seed(id, step, c->spec.method == CMP_RANDK ? 0 : 1 + dp->rank);
    c->guarded += cmp_encode(&c->spec, c->a, n, seed, c->error_feedback, out, c->idx, c->scratch);
    cmp_decode(&c->spec, out, n, c->idx, 0, n, c->dec);
    for (size_t i = 0; i < n; i++) {
        double diff = (double)c->a[i] - (double)c->dec[i];
        c->err2 += diff * diff;
        c->norm2 += (double)c->a[i] * c->a[i];
    }
    if (b->residual) {
        c->values += n;
        c->conserved += cmp_residual(&c->spec, c->a, c->dec, c->idx, b->residual, n, &c->max_err);
    }
}

// The all-reduce of a bucket (dp_allreduce_avg): compress, all-gather the payloads over our
// counted ring (or the native all-gather), decode and add in the ring's order, average.
static inline void compress_allreduce(DataParallel* dp, floatX* buf, size_t n) {
    DPCompress* c = dp->compress;
    CmpBucket* b = cmp_find(c, buf, n);
    int N = dp->N, r = dp->rank, id = (int)(b - c->buckets.data());
    size_t P = cmp_payload_words(&c->spec, n);
    cmp_compress_bucket(dp, c, b, id, c->wire + (size_t)r * P);
    if (dp->use_ring) { allgather_ring(dp->comm, c->wire + (size_t)r * P, c->wire, (size_t)N * P, COMM_INT32); }
    else { allgather_native(dp->comm, c->wire + (size_t)r * P, c->wire, (size_t)N * P, COMM_INT32); }
    // block j of the balanced split is summed as the ring sums it: d_{j+1} first, d_j last
    float* sum = c->a;
    for (int t = 1; t <= N; t++) {
        for (int blk = 0; blk < N; blk++) {
            int src = (blk + t) % N;
            size_t lo = comm_block_offset(n, N, blk), cnt = comm_block_count(n, N, blk);
            if (cnt == 0) { continue; }
            float* into = t == 1 ? sum + lo : c->dec;
            cmp_decode(&c->spec, c->wire + (size_t)src * P, n, c->idx, lo, lo + cnt, into);
            if (t > 1) { comm_reduce_local(sum + lo, c->dec, cnt, COMM_FP32, COMM_SUM); }
        }
    }
    comm_avg_finish(sum, n, COMM_FP32, COMM_AVG, N);
    copy_floats_to_device(buf, sum, n);
}

// The push (ps_update): every rank compresses every slice, sends slice s to server s in
// ps_push's rounds; a server decodes and adds in ps_push's order (its own first, then the
// ranks r-1, r-2, ...), averages, and leaves the result in its slice of the gradients.
static inline void compress_ps_push(DataParallel* dp) {
    DPCompress* c = dp->compress;
    Comm* cm = dp->comm;
    int p = dp->N, r = dp->rank, S = dp->ps_servers;
    uint32_t* in = c->wire + (size_t)S * c->pmax;
    float* acc = NULL;
    std::vector<int> order;   // a server's own slice last: c->dec and c->idx (randk) are then its
    for (int s = 0; s < S; s++) {
        if (s != r) { order.push_back(s); }
    }
    if (r < S) { order.push_back(r); }
    for (int s : order) { cmp_compress_bucket(dp, c, &c->buckets[s], s, c->wire + (size_t)s * c->pmax); }
    size_t mine = r < S ? c->buckets[r].n : 0;
    if (r < S) {   // the sum starts with the server's own decoded slice
        acc = c->a;
        memcpy(acc, c->dec, mine * sizeof(float));
    }
    for (int k = 1; k < p; k++) {
        int dst = (r + k) % p, src = (r - k + p) % p;
        bool out = dst < S, inc = r < S;
        const uint32_t* o = out ? c->wire + (size_t)dst * c->pmax : NULL;
        size_t no = out ? cmp_payload_words(&c->spec, c->buckets[dst].n) : 0;
        size_t ni = inc ? cmp_payload_words(&c->spec, mine) : 0;
        if (out && inc) { comm_sendrecv(cm, o, no, dst, in, ni, src, COMM_INT32); }
        else if (out) { comm_send(cm, o, no, COMM_INT32, dst); }
        else if (inc) { comm_recv(cm, in, ni, COMM_INT32, src); }
        if (inc) {
            cmp_decode(&c->spec, in, mine, c->idx, 0, mine, c->dec);
            comm_reduce_local(acc, c->dec, mine, COMM_FP32, COMM_SUM);
        }
    }
    if (r < S) {
        comm_avg_finish(acc, mine, COMM_FP32, COMM_AVG, p);
        copy_floats_to_device(c->buckets[r].grad, acc, mine);
    }
}
