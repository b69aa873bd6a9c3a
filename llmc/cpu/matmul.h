// Matrix multiplication for the linear layers (nn.Linear): where the CPU spends its time.
//
//   forward : out[bt][o]      = bias[o] + sum_c inp[bt][c] * weight[o][c]   (bias may be NULL)
//   backward: dinp[bt][c]     = sum_o dout[bt][o] * weight[o][c]            (OVERWRITES dinp)
//             dweight[o][c]  += sum_bt dout[bt][o] * inp[bt][c]             (accumulates)
//             dbias[o]       += sum_bt dout[bt][o]                          (accumulates; may be NULL)
//   shapes: inp (BT, C), weight (OC, C) as in torch, out (BT, OC), with BT = B*T.
//
// FLOPs: each product does one multiply-add (2 FLOPs) per (bt, o, c) triple, so the forward
// costs 2*BT*C*OC FLOPs and the backward 4*BT*C*OC. For GPT-2 these make up nearly all of the
// ~6 * (number of parameters) * BT FLOPs of a training step.
//
// All three products are one operation, a GEMM  Cm(m,n) (+)= sum_k A(m,k) * Bm(k,n),
// read through strides: A(m,k) = A[m*sam + k*sak] and Bm(k,n) = Bm[k*sbk + n*sbn]:
//   forward : m=bt n=o k=c    A=inp    (sam=C,  sak=1)    Bm=weight (sbk=1, sbn=C)
//   dinp    : m=bt n=c k=o    A=dout   (sam=OC, sak=1)    Bm=weight (sbk=C, sbn=1)
//   dweight : m=o  n=c k=bt   A=dout   (sam=1,  sak=OC)   Bm=inp    (sbk=C, sbn=1)
// so we write one fast strided GEMM (gemm_blocked) and call it three times: it cuts the output
// into tiles, one thread each, and runs the micro-kernel of llmc/cpu/matmul_kernel.h over them.
//
// Implementations: ours (default), or cblas_sgemm with -DLLMC_OPENBLAS (matmul_openblas.h). Both
// are deterministic for a fixed thread count: every output element is summed by one thread, in a
// fixed order (no atomics, the k sum never split across threads); ours even for any thread
// count. dbias: matmul_bias_backward (matmul_kernel.h). The reference loops: matmul_naive.h.
#pragma once

#include <string.h>
#include "round.h"           // floatx_round: outputs stored in the --precision format
#include "matmul_kernel.h"   // the tiles, the micro-kernel, the packing, the bias gradient

// ----------------------------------------------------------------------------
// our GEMM: the loop over tiles

// Cm (M x N, row stride ldc) = (accumulate ? Cm : start) + A (M x K) . Bm (K x N), strided A, Bm;
// start: each row's start (the forward's bias, added as tiles are stored: no pass over Cm), or 0.
static inline void gemm_blocked(int M, int N, int K, const float* A, size_t sam, size_t sak,
                                const float* Bm, size_t sbk, size_t sbn, float* Cm, size_t ldc, bool accumulate,
                                const float* start = NULL) {
    if (M <= 0 || N <= 0) { return; }
    if (K <= 0) {  // empty sum
        if (!accumulate) { for (int m = 0; m < M; m++) { for (int n = 0; n < N; n++) { Cm[m * ldc + n] = start ? start[n] : 0.0f; } } }
        return;
    }
    MMTiles tiles = mm_tiles(M, N, K);   // tm x tn tiles of mc x nc, k in tk blocks of kcmax
    // A in place, not packed, when one of its strides is 1, as it is in every product here: forward
    // and dinp read rows of inp and dout, dweight columns of dout. (Not a column whose k stride is
    // a multiple of 4 KiB: its kc values would all fall in one set of the caches.)
    bool a_direct = sak == 1 || (sam == 1 && sak * sizeof(float) % 4096 != 0);
    int tm = tiles.tm, tn = tiles.tn, mc = tiles.mc, nc = tiles.nc, kcmax = tiles.kcmax;
    #pragma omp parallel
    {
        float* buf = mm_thread_buffer((size_t)(mc + nc) * kcmax);   // this thread's, kept from call to call
        float* Ap = buf;                        // packed MC x KC block of A
        float* Bp = buf + (size_t)mc * kcmax;   // packed KC x NC block of Bm
        // Tiles are numbered down each tile column, and each thread takes a contiguous range of
        // them (as a static schedule would). A run of its tiles in one column shares that
        // column's Bm: each k block of it is packed once, and the run's tiles use it in turn.
        int nth = omp_get_num_threads(), id = omp_get_thread_num(), ntiles = tm * tn;
        int t_end = (int)((long)ntiles * (id + 1) / nth);
        for (int t = (int)((long)ntiles * id / nth); t < t_end;) {
            int jt = t / tm, run_end = (jt + 1) * tm < t_end ? (jt + 1) * tm : t_end;
            int n0 = jt * nc, nlen = (N - n0 < nc) ? N - n0 : nc;
            for (int k0 = 0; k0 < K; k0 += kcmax) {
                int kc = (K - k0 < kcmax) ? K - k0 : kcmax;
                mm_pack(Bp, Bm + n0 * sbn + k0 * sbk, sbn, sbk, nlen, kc, MM_NR);
                for (int u = t; u < run_end; u++) {
                    int m0 = (u % tm) * mc, mlen = (M - m0 < mc) ? M - m0 : mc;
                    // A in place: only a last, partial sliver is packed (zero-padded)
                    int a_full = a_direct ? mlen / MM_MR * MM_MR : 0;
                    mm_pack(Ap, A + (m0 + a_full) * sam + k0 * sak, sam, sak, mlen - a_full, kc, MM_MR);
                    // for each Bm sliver (stays in L1), run down all the A slivers (from L2)
                    for (int jr = 0; jr < nlen; jr += MM_NR) {
                        int nr = (nlen - jr < MM_NR) ? nlen - jr : MM_NR;
                        for (int ir = 0; ir < mlen; ir += MM_MR) {
                            int mr = (mlen - ir < MM_MR) ? mlen - ir : MM_MR;
                            bool in_place = ir < a_full;
                            const float* a = in_place ? A + (m0 + ir) * sam + k0 * sak : Ap + (size_t)(ir - a_full) * kc;
                            mm_micro_kernel(kc, a, in_place ? sam : 1, in_place ? sak : MM_MR, Bp + (size_t)jr * kc,
                                            Cm + (m0 + ir) * ldc + (n0 + jr), ldc, mr, nr, accumulate || k0 > 0,
                                            start ? start + n0 + jr : NULL);
                        }
                    }
                }
            }
            t = run_end;
        }
    }
}

static inline void matmul_forward_blocked(float* out, const float* inp, const float* weight, const float* bias,
                                          int B, int T, int C, int OC) {
    gemm_blocked(B * T, OC, C, inp, C, 1, weight, 1, C, out, OC, false, bias);   // each row starts from the bias
}

static inline void matmul_backward_blocked(float* dinp, float* dweight, float* dbias, const float* dout,
                                           const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    if (dinp != NULL) { gemm_blocked(BT, C, OC, dout, OC, 1, weight, C, 1, dinp, C, false); }  // dinp = dout . weight
    if (dweight == NULL) { return; }
    gemm_blocked(OC, C, BT, dout, 1, OC, inp, C, 1, dweight, C, true);   // dweight += dout^T . inp
    if (dbias != NULL) { matmul_bias_backward(dbias, dout, BT, OC); }
}

#ifdef LLMC_OPENBLAS
#include "matmul_openblas.h"   // the same three products through cblas_sgemm
#endif

// ----------------------------------------------------------------------------
// the API used by the model; the implementation is chosen at compile time

static inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                                  int B, int T, int C, int OC) {
    PROFILE_OP("matmul", OP_FWD, cost_matmul_forward((double)B * T, C, OC, bias != NULL), C, OC);
#ifdef LLMC_OPENBLAS
    matmul_forward_openblas(out, inp, weight, bias, B, T, C, OC);
#else
    matmul_forward_blocked(out, inp, weight, bias, B, T, C, OC);
#endif
    floatx_round(out, (size_t)B * T * OC, ROUND_ACT);
}

// Either half may be skipped: dinp == NULL (no input gradient) or dweight == NULL (no weight or
// bias gradient), as the zero-bubble pipeline's B and W passes ask (llmc/model/zero_bubble_backward.h).
static inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, int B, int T, int C, int OC) {
    PROFILE_OP("matmul", OP_BWD, cost_matmul_backward((double)B * T, C, OC, dinp != NULL, dweight != NULL, dbias != NULL), C, OC);
#ifdef LLMC_OPENBLAS
    matmul_backward_openblas(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
#else
    matmul_backward_blocked(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
#endif
    floatx_round(dinp, (size_t)B * T * C, ROUND_GRAD);
    floatx_round(dweight, (size_t)OC * C, ROUND_GRAD);
    floatx_round(dbias, (size_t)OC, ROUND_GRAD);
}
