// OpenBLAS versions (-DLLMC_OPENBLAS): the same three products (llmc/cpu/matmul.h) as cblas_sgemm calls.
// Threads: the pthread build of OpenBLAS has its own thread pool, and it fights OpenMP's for
// the cores: after each parallel region the OpenMP threads spin-wait a while, and OpenBLAS's
// threads then run 2-3x slower (measured for short GEMMs on 2 cores; OMP_WAIT_POLICY=passive
// cures that but slows OpenMP elsewhere). So we use only OpenMP's threads: the team cuts the
// output into slices and each thread computes its slice with a single-threaded OpenBLAS
// call. OpenBLAS thus uses the omp_get_max_threads() cores of the OpenMP team and no more
// (OMP_NUM_THREADS=1: one core in all). Deterministic: the partition is fixed.
#pragma once

#include <string.h>
#include <omp.h>
#include <cblas.h>
#include "matmul_kernel.h"   // matmul_bias_backward

// this thread's share [lo, hi) of n items, in chunks of 16 floats (one 64-byte cache line)
static inline void mm_thread_slice(int n, int* lo, int* hi) {
    int nt = omp_get_num_threads(), chunk = ((n + nt - 1) / nt + 15) / 16 * 16;
    *lo = omp_get_thread_num() * chunk;
    *hi = (*lo + chunk < n) ? *lo + chunk : n;
}

static inline void matmul_forward_openblas(float* out, const float* inp, const float* weight, const float* bias,
                                           int B, int T, int C, int OC) {
    int BT = B * T;
    openblas_set_num_threads(1);
    #pragma omp parallel
    {
        int lo, hi;
        mm_thread_slice(OC, &lo, &hi);
        if (hi > lo) {
            if (bias != NULL) {  // start from the bias, and let sgemm accumulate (beta = 1)
                for (int bt = 0; bt < BT; bt++) { memcpy(out + (size_t)bt * OC + lo, bias + lo, (hi - lo) * sizeof(float)); }
            }
            // out[:, lo:hi] (BT x n) = inp (BT x C) . weight[lo:hi, :]^T (C x n)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, hi - lo, C,
                        1.0f, inp, C, weight + (size_t)lo * C, C, bias != NULL ? 1.0f : 0.0f, out + lo, OC);
        }
    }
}

static inline void matmul_backward_openblas(float* dinp, float* dweight, float* dbias, const float* dout,
                                            const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    openblas_set_num_threads(1);
    #pragma omp parallel
    {
        int lo, hi;
        mm_thread_slice(C, &lo, &hi);
        if (hi > lo && dinp != NULL) {  // dinp[:, lo:hi] (BT x n) = dout (BT x OC) . weight[:, lo:hi] (OC x n)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, hi - lo, OC,
                        1.0f, dout, OC, weight + lo, C, 0.0f, dinp + lo, C);
        }
        mm_thread_slice(OC, &lo, &hi);
        if (hi > lo && dweight != NULL) {  // dweight[lo:hi, :] (n x C) += dout[:, lo:hi]^T (n x BT) . inp (BT x C)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, C, BT,
                        1.0f, dout + lo, OC, inp, C, 1.0f, dweight + (size_t)lo * C, C);
        }
    }
    if (dbias != NULL) { matmul_bias_backward(dbias, dout, BT, OC); }
}
