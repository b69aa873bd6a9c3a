// Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; the lecture
// "LLM Pre-training and Beyond", slide "Context Parallelism, CP": "CP ~ Ring Attention").
// The cp ranks form a ring. Rank r keeps the queries Q_r of its tokens; the key/value blocks
// travel: at step j it holds the block of rank r - j, computes Q_r against it, and meanwhile
// sends it to r+1 and receives the next one from r-1 (cp = 4):
//
//          step 0    step 1    step 2    step 3
//     r0   Q0.KV0    Q0.KV3    Q0.KV2    Q0.KV1          r0 --> r1 --> r2 --> r3
//     r1   Q1.KV1    Q1.KV0    Q1.KV3    Q1.KV2           ^                    |
//     r2   Q2.KV2    Q2.KV1    Q2.KV0    Q2.KV3           +--------------------+
//     r3   Q3.KV3    Q3.KV2    Q3.KV1    Q3.KV0          one K,V block per arrow and step
//
// The split (cp_seg_pos). Causal attention is a triangle: with the plain split (rank r: block r
// of T/cp tokens) rank r computes r full blocks and a half, the last ~2cp-1 times the first's
// work, and every step waits for the slowest. The zigzag split cuts the sequence into 2cp
// chunks and gives rank r chunks r and 2cp-1-r, an early one and a late one: equal work.
//          chunk   0  1  2  3  4  5  6  7        (cp = 4, zigzag)
//          rank    0  1  2  3  3  2  1  0
// A key chunk entirely after a query chunk is skipped (cp_future), but still passed on.
//
// The merge (online softmax in log-sum-exp form, attention_merge): a block gives, per query row
// and head, its normalised output O_b and lse_b = log sum_j exp(s_j) over its visible keys.
// Into the running (O, lse), which starts at (0, -inf):
//     m = max(lse, lse_b),   w = exp(lse - m),   w_b = exp(lse_b - m)     (the max: exp <= 1)
//     O = (w O + w_b O_b) / (w + w_b),   lse = m + log(w + w_b)
// The backward: with the final O and lse saved, P_ij = exp(s_ij - lse_i) and D_i = dO_i . O_i
// make every block's share of dQ, dK, dV exact on its own (attention_block_backward). The blocks
// go round the ring again; dQ stays home, and each block's dK, dV travel behind it, summed on
// the way, and reach their owner after cp - 1 hops.
//
// Cost per layer, per rank, E = B (T/cp) C elements, a = sizeof(floatX): forward cp - 1 sends
// of a K,V block (2E a), backward cp - 1 again plus cp - 1 of the dK,dV sums (2E fp32), each
// hidden behind a block's attention when that takes longer. Memory: two K,V blocks, whatever cp.
#pragma once

#include "cp_core.h"

// ring step: post the messages (to r+1, from r-1) and return; cp_ring_wait completes them
static inline void cp_ring_post(ContextParallel* cp, CommPending* p, const CommMsg* msgs, int n, CommType t) {
    cp_comm_ready(cp);
    double t0 = trace_now();
    comm_exchange_start(cp->comm, msgs, n, t, p);
    cp->seconds += trace_now() - t0;
}
static inline void cp_ring_wait(ContextParallel* cp, CommPending* p, const char* name) {
    double t0 = trace_now();   // only the wait the computation did not hide
    comm_exchange_finish(p);
    cp_end_call(cp, name, t0);
}

// One key/value block against this rank's queries. kv: (B, Tl, 2C) [k | v] of rank `src`.
// Forward: each (query segment, key segment) pair not in the future gives a partial (O, lse),
// merged into the accumulator (o_acc (B, Tl, C) fp32, lse_acc (B, NH, Tl)).
static inline void cp_block_forward(ContextParallel* cp, int B, float* o_acc, float* lse_acc, const floatX* qkv,
                                    const floatX* kv, int src, int C, int NH) {
    int Tseg = cp->Tseg, Tl = cp->Tl;
    for (int qs = 0; qs < cp->nseg; qs++) {
        int qpos = cp_seg_pos(cp, cp->rank, qs);
        for (int ks = 0; ks < cp->nseg; ks++) {
            int kpos = cp_seg_pos(cp, src, ks);
            if (cp_future(qpos, kpos, Tseg)) { continue; }
            const floatX* k = kv + (size_t)ks * Tseg * 2 * C;
            attention_block_forward(cp->o_part, cp->lse_part, qkv + (size_t)qs * Tseg * 3 * C, Tl, 3 * C, k, k + C, Tl, 2 * C,
                                    B, Tseg, Tseg, C, NH, qpos, kpos);
            attention_merge(o_acc + (size_t)qs * Tseg * C, lse_acc + (size_t)qs * Tseg, Tl, cp->o_part, cp->lse_part, B, Tseg, C, NH);
            cp->pairs_step += cp_pairs(qpos, kpos, Tseg);
        }
    }
}

// Backward of the same pairs: dq (B, Tl, C) and this block's dkv (B, Tl, 2C) accumulate (fp32)
static inline void cp_block_backward(ContextParallel* cp, int B, float* dq, float* dkv, const floatX* dout,
                                     const float* lse, const floatX* qkv, const floatX* kv, int src, int C, int NH) {
    int Tseg = cp->Tseg, Tl = cp->Tl;
    for (int qs = 0; qs < cp->nseg; qs++) {
        int qpos = cp_seg_pos(cp, cp->rank, qs);
        for (int ks = 0; ks < cp->nseg; ks++) {
            int kpos = cp_seg_pos(cp, src, ks);
            if (cp_future(qpos, kpos, Tseg)) { continue; }
            size_t q0 = (size_t)qs * Tseg, k0 = (size_t)ks * Tseg;
            const floatX* k = kv + k0 * 2 * C;
            float* dk = dkv + k0 * 2 * C;
            attention_block_backward(dq + q0 * C, Tl, dk, dk + C, Tl, 2 * C, dout + q0 * C, Tl, lse + q0, cp->delta + q0, Tl,
                                     qkv + q0 * 3 * C, Tl, 3 * C, k, k + C, Tl, 2 * C, B, Tseg, Tseg, C, NH, qpos, kpos);
        }
    }
}

// The forward, the model's attention op: out (B, Tl, C). The saved state per layer is the
// merged O (B, Tl, C) fp32, then lse (B, NH, Tl).
static inline void cp_ring_forward(void* ctx, const OpAt* at, floatX* out, float* state, const floatX* qkv, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    int B = at->B, Tl = cp->Tl;
    size_t n = (size_t)B * Tl * 2 * C;   // one rank's K,V block
    float* o_acc = state;
    float* lse_acc = state + (size_t)B * Tl * C;
    fill_floats(o_acc, 0.0f, (size_t)B * Tl * C);
    fill_floats(lse_acc, -INFINITY, (size_t)B * NH * Tl);
    copy_rows(cp->kv[0], Tl, 2 * C, qkv + C, Tl, 3 * C, B, Tl, 2 * C);   // pack this rank's k | v
    int cur = 0;
    for (int j = 0; j < cp->cp; j++) {   // step j: the block of rank - j
        CommPending p;
        if (j < cp->cp - 1) {   // pass the block in hand on, receive the next one meanwhile
            CommMsg m[2] = {{cp->kv[cur], NULL, n, cp_next(cp), 1}, {NULL, cp->kv[1 - cur], n, cp_prev(cp), 1}};
            cp_ring_post(cp, &p, m, 2, COMM_FLOATX);
        }
        cp_block_forward(cp, B, o_acc, lse_acc, qkv, cp->kv[cur], (cp->rank - j + cp->cp) % cp->cp, C, NH);
        if (j < cp->cp - 1) {
            cp_ring_wait(cp, &p, "CP ring K,V");
            cur = 1 - cur;
        }
    }
    store_rows(out, Tl, C, o_acc, Tl, C, B, Tl, C);
}

// The backward: dqkv (B, Tl, 3C) from dout and the saved O, lse.
// Step j holds the block of src = rank - j. Its dK,dV: this rank's part (work) plus the part of
// the ranks before it on the ring (incoming, from r-1, in flight while we compute); the sum goes
// on to r+1 during the next step. After step cp-1 it goes to the owner (r+1 holds the block of
// rank - (cp-1) = r+1), and the sum for our own block arrives from r-1.
static inline void cp_ring_backward(void* ctx, const OpAt* at, floatX* dqkv, const floatX* dout, const floatX* qkv,
                                    const float* state, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    int B = at->B, Tl = cp->Tl;
    size_t n = (size_t)B * Tl * 2 * C;
    const float* o = state;
    const float* lse = state + (size_t)B * Tl * C;
    attention_block_delta(cp->delta, dout, o, B, Tl, C, NH);
    fill_floats(cp->dq, 0.0f, (size_t)B * Tl * C);
    float* dkv_own = cp->dkv[0];
    copy_rows(cp->kv[0], Tl, 2 * C, qkv + C, Tl, 3 * C, B, Tl, 2 * C);
    fill_floats(dkv_own, 0.0f, n);
    float *work = cp->dkv[1], *sending = cp->dkv[2], *incoming = cp->dkv[3];
    int cur = 0;
    for (int j = 0; j < cp->cp; j++) {
        CommPending pk, pd;
        int post_kv = j + 1 < cp->cp, post_dkv = j >= 2;
        if (post_kv) {   // the next step's K,V
            CommMsg m[2] = {{cp->kv[cur], NULL, n, cp_next(cp), 1}, {NULL, cp->kv[1 - cur], n, cp_prev(cp), 1}};
            cp_ring_post(cp, &pk, m, 2, COMM_FLOATX);
        }
        if (post_dkv) {   // the last step's sum to r+1, this step's block's from r-1
            CommMsg m[2] = {{sending, NULL, n, cp_next(cp), 2}, {NULL, incoming, n, cp_prev(cp), 2}};
            cp_ring_post(cp, &pd, m, 2, COMM_FP32);
        }
        float* dkv = j == 0 ? dkv_own : work;
        if (j > 0) { fill_floats(work, 0.0f, n); }
        cp_block_backward(cp, B, cp->dq, dkv, dout, lse, qkv, cp->kv[cur], (cp->rank - j + cp->cp) % cp->cp, C, NH);
        if (post_kv) { cp_ring_wait(cp, &pk, "CP ring K,V"); }
        if (post_dkv) {
            cp_ring_wait(cp, &pd, "CP ring dK,dV");
            add_floats(work, incoming, n);
        }
        if (j > 0) { std::swap(work, sending); }   // this step's sum is the next message
        cur = 1 - cur;
    }
    if (cp->cp > 1) {   // home: our block's dK,dV from every other rank
        CommPending pd;
        CommMsg m[2] = {{sending, NULL, n, cp_next(cp), 2}, {NULL, incoming, n, cp_prev(cp), 2}};
        cp_ring_post(cp, &pd, m, 2, COMM_FP32);
        cp_ring_wait(cp, &pd, "CP ring dK,dV");
        add_floats(dkv_own, incoming, n);
    }
    store_rows(dqkv, Tl, 3 * C, cp->dq, Tl, C, B, Tl, C);
    store_rows(dqkv + C, Tl, 3 * C, dkv_own, Tl, 2 * C, B, Tl, 2 * C);
}
