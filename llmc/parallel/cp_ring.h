// Ring attention (--cp-algo ring) and its all-gather variant (--cp-algo allgather): this rank's
// queries against every rank's key/value block, one block at a time, each block's partial
// result merged into the running one (the math: cp.h's header; the kernels:
// llmc/cpu/attention_block.h and llmc/cuda/attention_block.cuh).
#pragma once

#include "cp_core.h"

// ---------------------------------------------------------------------------------------
// One key/value block against this rank's queries. kv: (B, Tl, 2C) [k | v] of rank `src`.
// Forward: each (query segment, key segment) pair not in the future gives a partial (O, lse),
// merged into the accumulator (o_acc (B, Tl, C) fp32, lse_acc (B, NH, Tl)).

static inline void cp_block_forward(ContextParallel* cp, int B, float* o_acc, float* lse_acc, const floatX* qkv,
                                    const floatX* kv, int src, int C, int NH) {
    int L = cp->L, Tl = cp->Tl;
    for (int qs = 0; qs < cp->nseg; qs++) {
        int qpos = cp_seg_pos(cp, cp->rank, qs);
        for (int ks = 0; ks < cp->nseg; ks++) {
            int kpos = cp_seg_pos(cp, src, ks);
            if (cp_future(qpos, kpos, L)) { continue; }
            const floatX* k = kv + (size_t)ks * L * 2 * C;
            attention_block_forward(cp->o_part, cp->lse_part, qkv + (size_t)qs * L * 3 * C, Tl, 3 * C, k, k + C, Tl, 2 * C,
                                    B, L, L, C, NH, qpos, kpos);
            attention_merge(o_acc + (size_t)qs * L * C, lse_acc + (size_t)qs * L, Tl, cp->o_part, cp->lse_part, B, L, C, NH);
            cp->pairs_step += cp_pairs(qpos, kpos, L);
        }
    }
}

// Backward of the same pairs: dq (B, Tl, C) and this block's dkv (B, Tl, 2C) accumulate (fp32)
static inline void cp_block_backward(ContextParallel* cp, int B, float* dq, float* dkv, const floatX* dout,
                                     const float* lse, const floatX* qkv, const floatX* kv, int src, int C, int NH) {
    int L = cp->L, Tl = cp->Tl;
    for (int qs = 0; qs < cp->nseg; qs++) {
        int qpos = cp_seg_pos(cp, cp->rank, qs);
        for (int ks = 0; ks < cp->nseg; ks++) {
            int kpos = cp_seg_pos(cp, src, ks);
            if (cp_future(qpos, kpos, L)) { continue; }
            size_t q0 = (size_t)qs * L, k0 = (size_t)ks * L;
            const floatX* k = kv + k0 * 2 * C;
            float* dk = dkv + k0 * 2 * C;
            attention_block_backward(dq + q0 * C, Tl, dk, dk + C, Tl, 2 * C, dout + q0 * C, Tl, lse + q0, cp->delta + q0, Tl,
                                     qkv + q0 * 3 * C, Tl, 3 * C, k, k + C, Tl, 2 * C, B, L, L, C, NH, qpos, kpos);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Ring and allgather: the saved state per layer is O (B, Tl, C) fp32, then lse (B, NH, Tl).

static inline void cp_merge_forward(void* ctx, const OpAt* at, floatX* out, float* state, const floatX* qkv, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    int B = at->B, Tl = cp->Tl;
    size_t n = (size_t)B * Tl * 2 * C;   // one rank's K,V block
    float* o_acc = state;
    float* lse_acc = state + (size_t)B * Tl * C;
    fill_floats(o_acc, 0.0f, (size_t)B * Tl * C);
    fill_floats(lse_acc, -INFINITY, (size_t)B * NH * Tl);
    copy_rows(cp->kv[0], Tl, 2 * C, qkv + C, Tl, 3 * C, B, Tl, 2 * C);   // pack this rank's k | v
    if (cp->algo == CP_ALLGATHER) {
        cp_allgather(cp, "CP all-gather K,V", cp->kv[0], cp->kv_all, n, COMM_FLOATX);
        for (int s = 0; s < cp->cp; s++) { cp_block_forward(cp, B, o_acc, lse_acc, qkv, cp->kv_all + s * n, s, C, NH); }
    } else {
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
    }
    store_rows(out, Tl, C, o_acc, Tl, C, B, Tl, C);
}

static inline void cp_merge_backward(void* ctx, const OpAt* at, floatX* dqkv, const floatX* dout, const floatX* qkv,
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
    if (cp->algo == CP_ALLGATHER) {   // the whole sequence's K,V again, every block's dK,dV, reduce-scatter to owners
        cp_allgather(cp, "CP all-gather K,V", cp->kv[0], cp->kv_all, n, COMM_FLOATX);
        fill_floats(cp->dkv_all, 0.0f, n * cp->cp);
        for (int s = 0; s < cp->cp; s++) {
            cp_block_backward(cp, B, cp->dq, cp->dkv_all + s * n, dout, lse, qkv, cp->kv_all + s * n, s, C, NH);
        }
        cp_reduce_scatter(cp, "CP reduce-scatter dK,dV", cp->dkv_all, dkv_own, n, COMM_FP32);
    } else {
        // Step j holds the block of src = rank - j. Its dK,dV: this rank's part (work) plus the part
        // of the ranks before it on the ring (incoming, from r-1, in flight while we compute); the
        // sum goes on to r+1 during the next step. After step cp-1 it goes to the owner (r+1 holds
        // the block of rank - (cp-1) = r+1), and the sum for our own block arrives from r-1.
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
    }
    store_rows(dqkv, Tl, 3 * C, cp->dq, Tl, C, B, Tl, C);
    store_rows(dqkv + C, Tl, 3 * C, dkv_own, Tl, 2 * C, B, Tl, 2 * C);
}
