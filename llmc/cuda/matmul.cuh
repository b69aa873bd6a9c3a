// Linear layers through cuBLASLt (formulas and shapes in llmc/cpu/matmul.h):
//   forward : out(BT,OC)   = inp(BT,C) @ weight(OC,C)^T + bias     (bias epilogue; may be NULL)
//   backward: dinp(BT,C)   = dout(BT,OC) @ weight(OC,C)            (OVERWRITES dinp, beta = 0)
//             dweight(OC,C) += dout^T @ inp                         (accumulates, beta = 1)
//             dbias(OC)    += column sums of dout                   (our deterministic kernel)
// cuBLAS is column-major; a row-major (R x K) array is the same memory as a column-major
// (K x R) one, so every product is written for the transposes:
//   forward : out^T (OC x BT)  = op_T(weight as C x OC) * inp as (C x BT)
//   dinp    : dinp^T (C x BT)  = weight as (C x OC)     * dout as (OC x BT)
//   dweight : dweight^T (C x OC) += inp as (C x BT)     * op_T(dout as OC x BT)
// Precision: bf16 inputs and outputs, fp32 accumulation (CUBLAS_COMPUTE_32F); the fp32 build
// uses fp32 inputs with CUBLAS_COMPUTE_32F, which excludes TF32, so it meets fp32 tolerances.
// Determinism: cuBLAS gives the same bits for the same problem, algorithm and GPU; we ask the
// heuristic with the actual pointer alignments and allow only split-K reductions in the compute
// type (fp32), so the choice and the sum order are fixed and the output is rounded once. Excluded:
// "in place" (it sums the pieces in the output buffer, in any order) and "output type" (it rounds
// each piece to bf16 before summing). On an H200 (CUDA 13.0), with only "in place" excluded, the
// bias epilogue and the accumulating dweight came out rounded twice at small shapes
// (test_cuda_kernels): what "output type" does; that this was the cause awaits the next GPU run.
#pragma once

#include <cublasLt.h>
#include "common.cuh"

#define cublasCheck(call) cublas_check((call), #call, __FILE__, __LINE__)
static inline void cublas_check(cublasStatus_t status, const char* what, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fflush(stdout);
        fprintf(stderr, "error: cuBLAS error %d at %s:%d\n       in %s\n", (int)status, file, line, what);
        exit(1);
    }
}

static cublasLtHandle_t cublaslt_handle = NULL;
static void* cublaslt_workspace = NULL;
static const size_t CUBLASLT_WORKSPACE_BYTES = (size_t)32 << 20;   // 32 MiB, as NVIDIA advises for Hopper

static inline void cublaslt_setup() {
    if (cublaslt_handle) { return; }
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cudaCheck(cudaMalloc(&cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES));
}
static inline void cublaslt_cache_clear();   // below: destroys the cached matmul plans
static inline void cublaslt_teardown() {
    if (!cublaslt_handle) { return; }
    cublaslt_cache_clear();
    cublasCheck(cublasLtDestroy(cublaslt_handle));
    cudaCheck(cudaFree(cublaslt_workspace));
    cublaslt_handle = NULL;
    cublaslt_workspace = NULL;
}

#ifdef ENABLE_FP32
#define CUBLAS_FLOATX CUDA_R_32F
#else
#define CUBLAS_FLOATX CUDA_R_16BF
#endif

// the largest power of two (<= 256) that divides the address: what the heuristic may assume
static inline uint32_t pointer_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && a % align != 0) { align /= 2; }
    return align;
}

// The descriptors and the heuristic's choice for one problem, cached: the model makes the
// same few matmuls every step (about 150 calls for GPT-2 124M, a handful of distinct shapes),
// so the heuristic runs once per distinct key and every later call only sets the bias
// pointer and launches. The key holds everything the heuristic saw: shape, leading
// dimensions, transposes, epilogue (bias or none) and the three pointer alignments. A full
// table (more than CUBLASLT_CACHE_SIZE distinct problems) falls back to uncached calls.
// The cached algorithm is the one the uncached code would pick, so results are unchanged.
struct CublasLtPlan {
    int m, n, k, lda, ldb, ldd, trans_a, trans_b, has_bias;
    uint32_t align_a, align_b, align_d;
    int found;   // 0: the heuristic offered no algorithm (cached too, so it is asked once)
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};
#define CUBLASLT_CACHE_SIZE 64
static CublasLtPlan cublaslt_cache[CUBLASLT_CACHE_SIZE];
static int cublaslt_cache_used = 0;

static inline void cublaslt_plan_destroy(CublasLtPlan* p) {
    cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
}
static inline void cublaslt_cache_clear() {
    for (int i = 0; i < cublaslt_cache_used; i++) { cublaslt_plan_destroy(&cublaslt_cache[i]); }
    cublaslt_cache_used = 0;
}

// fills p's descriptors and asks the heuristic (p's key fields set by the caller; bias: the
// first call's bias pointer, set as the uncached code did; every call sets its own again)
static inline void cublaslt_plan_create(CublasLtPlan* p, const floatX* bias) {
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (p->has_bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bias_type = CUBLAS_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
    }
    // layouts of the matrices as stored (before op): A is m x k, or k x m when transposed
    int m = p->m, n = p->n, k = p->k;
    cublasCheck(cublasLtMatrixLayoutCreate(&p->la, CUBLAS_FLOATX, p->trans_a ? k : m, p->trans_a ? m : k, p->lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, CUBLAS_FLOATX, p->trans_b ? n : k, p->trans_b ? k : n, p->ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ld, CUBLAS_FLOATX, m, n, p->ldd));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->align_a, sizeof(p->align_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->align_b, sizeof(p->align_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->align_d, sizeof(p->align_d)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->align_d, sizeof(p->align_d)));
    uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;   // (no split-K, CUBLASLT_REDUCTION_SCHEME_NONE, is always allowed)
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1,
                                                       &result, &found);
    p->found = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->found) { p->algo = result.algo; }
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
}

// D(m,n) = alpha * op(A) op(B) + beta * D (+ bias[m] per row when bias != NULL), column-major.
// Returns 0 when no algorithm supports the request (the caller then drops the bias epilogue).
static inline int cublaslt_gemm(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n,
                                int k, int lda, int ldb, int ldd, int trans_a, int trans_b, float beta) {
    cublaslt_setup();
    CublasLtPlan key = {};
    key.m = m; key.n = n; key.k = k; key.lda = lda; key.ldb = ldb; key.ldd = ldd;
    key.trans_a = trans_a; key.trans_b = trans_b; key.has_bias = bias != NULL;
    key.align_a = pointer_alignment(a); key.align_b = pointer_alignment(b); key.align_d = pointer_alignment(d);
    CublasLtPlan* plan = NULL;
    for (int i = 0; i < cublaslt_cache_used && !plan; i++) {
        CublasLtPlan* p = &cublaslt_cache[i];
        if (p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb && p->ldd == ldd &&
            p->trans_a == trans_a && p->trans_b == trans_b && p->has_bias == key.has_bias &&
            p->align_a == key.align_a && p->align_b == key.align_b && p->align_d == key.align_d) {
            plan = p;
        }
    }
    bool cached = plan != NULL || cublaslt_cache_used < CUBLASLT_CACHE_SIZE;
    if (!plan) {
        plan = cached ? &cublaslt_cache[cublaslt_cache_used++] : &key;
        if (plan != &key) { *plan = key; }
        cublaslt_plan_create(plan, bias);
    }
    int ok = plan->found;
    if (ok) {
        if (bias) {   // the pointer is read at launch: setting it on a cached descriptor is safe
            cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        }
        float alpha = 1.0f;
        cublasCheck(cublasLtMatmul(cublaslt_handle, plan->desc, &alpha, a, plan->la, b, plan->lb, &beta, d, plan->ld, d,
                                   plan->ld, &plan->algo, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, 0));
    }
    if (!cached) { cublaslt_plan_destroy(plan); }
    return ok;
}

static inline void cublaslt_gemm_or_die(floatX* d, const floatX* a, const floatX* b, int m, int n, int k, int lda,
                                        int ldb, int ldd, int trans_a, int trans_b, float beta) {
    if (!cublaslt_gemm(d, a, b, NULL, m, n, k, lda, ldb, ldd, trans_a, trans_b, beta)) {
        die("cuBLASLt has no algorithm for a %dx%dx%d matmul (transa %d, transb %d) on this GPU", m, n, k, trans_a,
            trans_b);
    }
}

// out[r][o] += bias[o], the fallback when the bias epilogue is refused (e.g. a misaligned bias)
__global__ void add_bias_kernel(floatX* out, const floatX* bias, size_t rows, int OC) {
    size_t N = rows * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = from_float(to_float(out[i]) + to_float(bias[i % OC]));
    }
}

static inline void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                                  int B, int T, int C, int OC) {
    PROFILE_OP("matmul", OP_FWD, cost_matmul_forward((double)B * T, C, OC, bias != NULL), C, OC);
    int BT = B * T;
    // the epilogue reads the bias with vector loads: only offer it 16-byte aligned biases
    if (bias && pointer_alignment(bias) >= 16 && cublaslt_gemm(out, weight, inp, bias, OC, BT, C, C, C, OC, 1, 0, 0.0f)) {
        return;
    }
    cublaslt_gemm_or_die(out, weight, inp, OC, BT, C, C, C, OC, 1, 0, 0.0f);
    if (bias) {
        add_bias_kernel<<<grid_for((size_t)BT * OC, 256), 256>>>(out, bias, (size_t)BT, OC);
        cudaCheckLaunch();
    }
}

// dbias partial column sums: blocks of 32 columns x 8 row-lanes over chunks of rows, then a
// fixed-order sum of the chunks (add_column_partials_kernel in common.cuh)
#define BIAS_ROWS_PER_CHUNK 256
__global__ void bias_backward_partial_kernel(float* partial, const floatX* dout, int BT, int OC) {
    __shared__ float s[8][33];
    int o = blockIdx.x * 32 + threadIdx.x;
    int chunk = blockIdx.y;
    int r0 = chunk * BIAS_ROWS_PER_CHUNK, r1 = min(r0 + BIAS_ROWS_PER_CHUNK, BT);
    float acc = 0.0f;
    if (o < OC) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) { acc += to_float(dout[(size_t)r * OC + o]); }
    }
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        for (int y = 1; y < 8; y++) { acc += s[y][threadIdx.x]; }
        partial[(size_t)chunk * OC + o] = acc;
    }
}

static inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                                   const floatX* inp, const floatX* weight, int B, int T, int C, int OC) {
    PROFILE_OP("matmul", OP_BWD, cost_matmul_backward((double)B * T, C, OC, dinp != NULL, dweight != NULL, dbias != NULL), C, OC);
    static void* scratch = NULL;
    static size_t scratch_cap = 0;
    int BT = B * T;
    // either half may be skipped (NULL), as the zero-bubble pipeline's B and W passes ask
    if (dinp != NULL) { cublaslt_gemm_or_die(dinp, weight, dout, C, BT, OC, C, OC, C, 0, 0, 0.0f); }
    if (dweight == NULL) { return; }
    cublaslt_gemm_or_die(dweight, inp, dout, C, OC, BT, C, OC, C, 0, 1, 1.0f);
    if (dbias) {
        int nchunks = (int)ceil_div(BT, BIAS_ROWS_PER_CHUNK);
        float* partial = (float*)scratch_reserve(&scratch, &scratch_cap, (size_t)nchunks * OC * sizeof(float));
        dim3 grid((OC + 31) / 32, nchunks);
        bias_backward_partial_kernel<<<grid, dim3(32, 8)>>>(partial, dout, BT, OC);
        cudaCheckLaunch();
        add_column_partials_kernel<<<(OC + 255) / 256, 256>>>(dbias, partial, nchunks, OC);
        cudaCheckLaunch();
    }
}
