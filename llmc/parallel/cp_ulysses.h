// DeepSpeed-Ulysses (--cp-algo alltoall; Jacobs et al. 2023, "DeepSpeed Ulysses"; not on the
// lecture's slides, which draw the ring and the all-gather): around the attention, an
// all-to-all turns "T/cp tokens of every head" into "every token of NH/cp heads", the plain
// attention kernel runs on whole sequences, and an all-to-all turns the output back. The
// backward is the same with dO in and dq, dk, dv back. Needs NH (per tp rank) divisible by cp.
//
//     rank r:  q,k,v (T/cp tokens, NH heads) --all-to-all--> q,k,v (T tokens, NH/cp heads: group r)
//              attention per head --> out (T, NH/cp) --all-to-all--> out (T/cp tokens, NH heads)
#pragma once

#include "cp_core.h"

static inline void cp_alltoall(ContextParallel* cp, const char* name, const floatX* send, floatX* recv, size_t n) {
    cp_comm_ready(cp);
    double t0 = trace_now();
    if (cp->use_ring) { alltoall_pairwise(cp->comm, send, recv, n, COMM_FLOATX); }
    else { alltoall_native(cp->comm, send, recv, n, COMM_FLOATX); }
    cp_end_call(cp, name, t0);
}

// ---------------------------------------------------------------------------------------
// All-to-all (DeepSpeed-Ulysses). This rank's heads during attention: group g = rank, NH/cp
// heads of C/cp channels. A block of the all-to-all is (B, Tl, w): the send block for rank d holds
// d's heads of this rank's tokens; the received block from rank s holds this rank's heads of s's
// tokens, which go to their global positions in a whole-sequence (B, T, w) buffer.
// The saved state per layer: the kernel's state for (B, T, NH/cp), then the gathered q|k|v.

static inline size_t cp_a2a_att_floats(const ContextParallel* cp, int B, int NH) {
    return ceil_div(attention_state_size(B, cp->T, NH / cp->cp), 4) * 4;   // 16-byte aligned after it
}
// the op's state_size: the kernel's state, then the gathered q|k|v, each layer's 16-byte aligned
static inline size_t cp_a2a_state_size(void* ctx, int B, int T, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    cp_check_tokens(cp, T);
    size_t qkv = ceil_div((size_t)B * cp->T * 3 * (C / cp->cp) * sizeof(floatX), sizeof(float));
    return cp_a2a_att_floats(cp, B, NH) + ceil_div(qkv, 4) * 4;
}

// whole-sequence rows of width w <- this rank's heads' blocks from every rank (position order)
static inline void cp_a2a_unpack(const ContextParallel* cp, int B, floatX* full, const floatX* recv, int w) {
    size_t blk = (size_t)B * cp->Tl * w;
    for (int s = 0; s < cp->cp; s++) {
        for (int g = 0; g < cp->nseg; g++) {
            copy_rows(full + (size_t)cp_seg_pos(cp, s, g) * w, cp->T, w, recv + s * blk + (size_t)g * cp->Tseg * w, cp->Tl, w, B,
                      cp->Tseg, w);
        }
    }
}
// the reverse: the rows of rank s's tokens into send block s
static inline void cp_a2a_pack(const ContextParallel* cp, int B, floatX* send, const floatX* full, int w) {
    size_t blk = (size_t)B * cp->Tl * w;
    for (int s = 0; s < cp->cp; s++) {
        for (int g = 0; g < cp->nseg; g++) {
            copy_rows(send + s * blk + (size_t)g * cp->Tseg * w, cp->Tl, w, full + (size_t)cp_seg_pos(cp, s, g) * w, cp->T, w, B,
                      cp->Tseg, w);
        }
    }
}

static inline void cp_a2a_forward(void* ctx, const OpAt* at, floatX* out, float* state, const floatX* qkv, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    int B = at->B, Tl = cp->Tl, T = cp->T, Cc = C / cp->cp, NHc = NH / cp->cp;
    size_t blk3 = (size_t)B * Tl * 3 * Cc, blk1 = (size_t)B * Tl * Cc;
    float* att = state;
    floatX* full = (floatX*)(state + cp_a2a_att_floats(cp, B, NH));   // (B, T, 3 Cc): saved for the backward
    floatX *send = cp->a2a[0], *recv = cp->a2a[1], *out_full = cp->a2a[2];
    for (int d = 0; d < cp->cp; d++) {   // send block d: q | k | v of d's heads, this rank's tokens
        for (int part = 0; part < 3; part++) {
            copy_rows(send + d * blk3 + part * Cc, Tl, 3 * Cc, qkv + part * C + d * Cc, Tl, 3 * C, B, Tl, Cc);
        }
    }
    cp_alltoall(cp, "CP all-to-all q,k,v", send, recv, blk3);
    cp_a2a_unpack(cp, B, full, recv, 3 * Cc);
    attention_forward(out_full, att, full, B, T, Cc, NHc);   // whole sequences, NH/cp heads
    cp->pairs_step += (double)T * (T + 1) / 2 / cp->cp;     // per head of the model: NH/cp of them here
    cp_a2a_pack(cp, B, send, out_full, Cc);
    cp_alltoall(cp, "CP all-to-all out", send, recv, blk1);
    for (int s = 0; s < cp->cp; s++) { copy_rows(out + s * Cc, Tl, C, recv + s * blk1, Tl, Cc, B, Tl, Cc); }
}

static inline void cp_a2a_backward(void* ctx, const OpAt* at, floatX* dqkv, const floatX* dout, const floatX* qkv,
                                   const float* state, int C, int NH) {
    ContextParallel* cp = (ContextParallel*)ctx;
    (void)qkv;
    int B = at->B, Tl = cp->Tl, T = cp->T, Cc = C / cp->cp, NHc = NH / cp->cp;
    size_t blk3 = (size_t)B * Tl * 3 * Cc, blk1 = (size_t)B * Tl * Cc;
    const float* att = state;
    const floatX* full = (const floatX*)(state + cp_a2a_att_floats(cp, B, NH));
    floatX *send = cp->a2a[0], *recv = cp->a2a[1], *dout_full = cp->a2a[2], *dfull = cp->a2a[3];
    for (int d = 0; d < cp->cp; d++) { copy_rows(send + d * blk1, Tl, Cc, dout + d * Cc, Tl, C, B, Tl, Cc); }
    cp_alltoall(cp, "CP all-to-all dout", send, recv, blk1);
    cp_a2a_unpack(cp, B, dout_full, recv, Cc);
    attention_backward(dfull, dout_full, full, att, B, T, Cc, NHc);
    cp_a2a_pack(cp, B, send, dfull, 3 * Cc);
    cp_alltoall(cp, "CP all-to-all dq,dk,dv", send, recv, blk3);
    for (int s = 0; s < cp->cp; s++) {
        for (int part = 0; part < 3; part++) {
            copy_rows(dqkv + part * C + s * Cc, Tl, 3 * C, recv + s * blk3 + part * Cc, Tl, 3 * Cc, B, Tl, Cc);
        }
    }
}
