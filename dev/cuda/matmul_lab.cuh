// The lab's own GEMM kernels, shared by matmul_forward.cu and matmul_backward.cu.
// One strided GEMM does all three products of a linear layer (as llmc/cpu/matmul.h explains):
//   Cm(m,n) = (accumulate ? Cm(m,n) : 0) + bias[n] + sum_k A(m,k) Bm(k,n)
//   A(m,k) = A[m*sam + k*sak],  Bm(k,n) = Bm[k*sbk + n*sbn],  Cm row-major with row stride ldc
// Inputs floatX, accumulation fp32, one rounding to floatX at the end.
#pragma once

// version 1: one thread per output element, the k loop straight from global memory. Each
// A and Bm value is loaded by every thread that needs it (n resp. m times): global-memory bound
// at a small fraction of the compute peak.
__global__ void gemm_naive_kernel(floatX* Cm, const floatX* A, const floatX* Bm, const floatX* bias, int M, int N, int K,
                                  size_t sam, size_t sak, size_t sbk, size_t sbn, size_t ldc, int accumulate) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;   // adjacent threads: adjacent columns of Cm
    int m = blockIdx.y * blockDim.y + threadIdx.y;
    if (m >= M || n >= N) { return; }
    float acc = bias ? dev_to_float(bias[n]) : 0.0f;
    for (int k = 0; k < K; k++) { acc += dev_to_float(A[m * sam + k * sak]) * dev_to_float(Bm[k * sbk + n * sbn]); }
    floatX* c = Cm + (size_t)m * ldc + n;
    *c = dev_from_float((accumulate ? dev_to_float(*c) : 0.0f) + acc);
}

// version 2: shared-memory tiling with register blocking. A block of 16x16 threads owns a
// 64x64 tile of Cm; the k dimension is walked in steps of 16: the block copies a 64x16 slab
// of A and a 16x64 slab of Bm into shared memory (each value loaded from global memory once
// per block instead of once per thread), then every thread multiplies them into its 4x4
// outputs held in registers (rows ty + 16i, columns tx + 16j: in a warp the A reads are
// broadcasts and the Bm reads hit 16 different banks). Arithmetic intensity per shared load
// goes from 1/2 to 2 FMAs, and per global load from ~1 to 32.
#define GT 64   // tile of Cm: GT x GT
#define GK 16   // depth of a slab
__global__ void __launch_bounds__(256) gemm_tiled_kernel(floatX* Cm, const floatX* A, const floatX* Bm, const floatX* bias,
        int M, int N, int K, size_t sam, size_t sak, size_t sbk, size_t sbn, size_t ldc, int accumulate) {
    __shared__ float As[GK][GT];   // As[k][m - m0]
    __shared__ float Bs[GK][GT];   // Bs[k][n - n0]
    int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
    int m0 = blockIdx.y * GT, n0 = blockIdx.x * GT;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += GK) {
        // 1024 values per slab, 4 per thread; the fastest-moving index follows the unit stride
        // in memory, so that neighbouring threads read neighbouring addresses (coalesced)
        for (int l = 0; l < 4; l++) {
            int idx = tid + 256 * l, r, kk;
            if (sak == 1) { kk = idx % GK; r = idx / GK; } else { r = idx % GT; kk = idx / GT; }
            int m = m0 + r, k = k0 + kk;
            As[kk][r] = (m < M && k < K) ? dev_to_float(A[m * sam + k * sak]) : 0.0f;
            int c;
            if (sbk == 1) { kk = idx % GK; c = idx / GK; } else { c = idx % GT; kk = idx / GT; }
            int n = n0 + c;
            k = k0 + kk;
            Bs[kk][c] = (n < N && k < K) ? dev_to_float(Bm[k * sbk + n * sbn]) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < GK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) { a[i] = As[kk][ty + 16 * i]; b[i] = Bs[kk][tx + 16 * i]; }
            for (int i = 0; i < 4; i++) {
                for (int j = 0; j < 4; j++) { acc[i][j] += a[i] * b[j]; }
            }
        }
        __syncthreads();   // the slabs are overwritten next iteration
    }
    for (int i = 0; i < 4; i++) {
        int m = m0 + ty + 16 * i;
        if (m >= M) { continue; }
        for (int j = 0; j < 4; j++) {
            int n = n0 + tx + 16 * j;
            if (n >= N) { continue; }
            float v = acc[i][j] + (bias ? dev_to_float(bias[n]) : 0.0f);
            floatX* c = Cm + (size_t)m * ldc + n;
            *c = dev_from_float((accumulate ? dev_to_float(*c) : 0.0f) + v);
        }
    }
}

static inline void gemm_lab(int version, floatX* Cm, const floatX* A, const floatX* Bm, const floatX* bias, int M, int N, int K,
                            size_t sam, size_t sak, size_t sbk, size_t sbn, size_t ldc, int accumulate) {
    if (version == 1) {
        dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
        gemm_naive_kernel<<<grid, block>>>(Cm, A, Bm, bias, M, N, K, sam, sak, sbk, sbn, ldc, accumulate);
    } else {
        dim3 block(16, 16), grid((N + GT - 1) / GT, (M + GT - 1) / GT);
        gemm_tiled_kernel<<<grid, block>>>(Cm, A, Bm, bias, M, N, K, sam, sak, sbk, sbn, ldc, accumulate);
    }
    LAB_LAUNCH_CHECK();
}

// cuBLAS (the classic API): bf16 in and out, fp32 accumulation, tensor cores.
#ifdef ENABLE_FP32
#define LAB_CUDA_FLOATX CUDA_R_32F
#else
#define LAB_CUDA_FLOATX CUDA_R_16BF
#endif
static cublasHandle_t lab_cublas = NULL;
static inline void lab_cublas_check(cublasStatus_t st, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) { die("cuBLAS error %d at %s:%d", (int)st, __FILE__, line); }
}
// column-major Cc(m,n) = alpha op(Ac) op(Bc) + beta Cc, as cublasGemmEx sees it
static inline void lab_cublas_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const floatX* Ac, int lda,
                                   const floatX* Bc, int ldb, floatX* Cc, int ldc, float beta) {
    if (lab_cublas == NULL) { lab_cublas_check(cublasCreate(&lab_cublas), __LINE__); }
    float alpha = 1.0f;
    lab_cublas_check(cublasGemmEx(lab_cublas, ta, tb, m, n, k, &alpha, Ac, LAB_CUDA_FLOATX, lda, Bc, LAB_CUDA_FLOATX, ldb,
                                  &beta, Cc, LAB_CUDA_FLOATX, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), __LINE__);
}
