// The emulator checks itself (dev/emu/README.md): before the project's kernels are trusted to
// it, each thing it claims is tried on a small kernel written for that purpose:
//   - warp shuffles (idx, xor, down, up; widths 32, 16, 8) and votes against their definitions;
//   - mma.sync m16n8k16 bf16: fragments loaded following the PTX ISA's table (written out again
//     here, independently of emu_ptx.h) give D = A B + C of a double-precision matmul; fragments
//     loaded with two registers swapped do not (the check can fail);
//   - ldmatrix x1/x2/x4, with and without .trans, put each element where the ISA says;
//   - a kernel missing its __syncthreads gives a wrong result in at least one thread order,
//     the same kernel with it is right in all three;
//   - shared memory starts as NaN; bad launch configurations set the launch error;
//   - streams: a launch runs when the host waits for it; work on a non-blocking stream is not
//     ordered after stream 0's unless it waits for an event (it reads the old data without
//     one), a blocking stream's is;
//   - deadlocks (a barrier or shuffle in divergent code) end the program with a message and
//     exit status 1, never a hang (run in a child process);
//   - built with AddressSanitizer (test_emu_asan): a write one element past a cudaMalloc'd
//     buffer, or past the dynamic shared memory, is reported (in a child process).
// Prints PASS/FAIL per check; exit status 1 if any failed.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include <sys/wait.h>
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#ifndef LLMC_EMU
#error "dev/emu/test_emu.cu tests the CUDA emulator: build it with make build/emu/test_emu"
#endif

static int failures = 0;
static void report(const char* name, bool ok, const std::string& detail) {
    printf("%s %-58s %s\n", ok ? "PASS" : "FAIL", name, detail.c_str());
    if (!ok) { failures++; }
}
static std::string fmt(const char* f, double a, double b = 0.0) {
    char buf[160];
    snprintf(buf, sizeof(buf), f, a, b);
    return buf;
}
static const char* ORDERS[] = {"forward", "reverse", "random"};

// ---------------------------------------------------------------------------------------
// shuffles and votes

__global__ void shuffle_kernel(int* out, int width) {
    int lane = threadIdx.x % 32;
    int v = 100 * (threadIdx.x / 32) + lane;
    out[threadIdx.x * 8 + 0] = __shfl_sync(0xffffffffu, v, 3, width);
    out[threadIdx.x * 8 + 1] = __shfl_xor_sync(0xffffffffu, v, 5 % width, width);
    out[threadIdx.x * 8 + 2] = __shfl_down_sync(0xffffffffu, v, 2, width);
    out[threadIdx.x * 8 + 3] = __shfl_up_sync(0xffffffffu, v, 3, width);
    out[threadIdx.x * 8 + 4] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    out[threadIdx.x * 8 + 5] = __any_sync(0xffffffffu, lane == 17);
    out[threadIdx.x * 8 + 6] = __all_sync(0xffffffffu, lane < 31);
    float f = __shfl_xor_sync(0xffffffffu, (float)v + 0.5f, 1);
    out[threadIdx.x * 8 + 7] = (int)(f * 2.0f);
}

static void test_shuffles() {
    const int n = 64;
    int* d;
    cudaMalloc(&d, n * 8 * sizeof(int));
    for (int width : {32, 16, 8}) {
        shuffle_kernel<<<1, n>>>(d, width);
        std::vector<int> h(n * 8);
        cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost);
        int bad = 0;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++) { if (l % 3 == 0) { ballot |= 1u << l; } }
        for (int t = 0; t < n; t++) {
            int lane = t % 32, warp = t / 32, base = lane - lane % width;
            auto val = [&](int l) { return 100 * warp + l; };
            int want[8] = {val(base + 3), val(base + ((lane - base) ^ (5 % width))),
                           lane - base + 2 < width ? val(lane + 2) : val(lane), lane - base >= 3 ? val(lane - 3) : val(lane),
                           (int)ballot, 1, 0, (int)((val(lane ^ 1) + 0.5f) * 2.0f)};
            for (int k = 0; k < 8; k++) { bad += h[t * 8 + k] != want[k]; }
        }
        char name[64];
        snprintf(name, sizeof(name), "shuffles and votes, width %d", width);
        report(name, bad == 0, fmt("%.0f wrong of 512", bad));
    }
    cudaFree(d);
}

// ---------------------------------------------------------------------------------------
// mma.sync.m16n8k16 bf16: the fragment table of the PTX ISA, written out here

__device__ uint32_t pack2(const __nv_bfloat16* m, int i0, int i1) {   // two bf16, first in the low bits
    __nv_bfloat16_raw lo = m[i0], hi = m[i1];
    return (uint32_t)lo.x | ((uint32_t)hi.x << 16);
}

// A 16x16 row-major, B 16x8 (stored row-major by k: B[k][n] at b[k * 8 + n]), C, D 16x8 fp32
__global__ void mma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, int swap) {
    int lane = threadIdx.x, g = lane / 4, q = lane % 4;
    uint32_t ra[4] = {pack2(a, g * 16 + 2 * q, g * 16 + 2 * q + 1), pack2(a, (g + 8) * 16 + 2 * q, (g + 8) * 16 + 2 * q + 1),
                      pack2(a, g * 16 + 2 * q + 8, g * 16 + 2 * q + 9), pack2(a, (g + 8) * 16 + 2 * q + 8, (g + 8) * 16 + 2 * q + 9)};
    if (swap) { uint32_t t = ra[1]; ra[1] = ra[2]; ra[2] = t; }   // a broken fragment
    uint32_t b0 = pack2(b, (2 * q) * 8 + g, (2 * q + 1) * 8 + g), b1 = pack2(b, (2 * q + 8) * 8 + g, (2 * q + 9) * 8 + g);
    float acc[4] = {c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]};
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(b0), "r"(b1));
    d[g * 8 + 2 * q] = acc[0];
    d[g * 8 + 2 * q + 1] = acc[1];
    d[(g + 8) * 8 + 2 * q] = acc[2];
    d[(g + 8) * 8 + 2 * q + 1] = acc[3];
}

static void test_mma() {
    std::vector<__nv_bfloat16> a(256), b(128);
    std::vector<float> af(256), bf(128), c(128);
    srand(7);
    for (int i = 0; i < 256; i++) { a[i] = __float2bfloat16_rn((rand() % 2001 - 1000) / 500.0f); af[i] = __bfloat162float(a[i]); }
    for (int i = 0; i < 128; i++) { b[i] = __float2bfloat16_rn((rand() % 2001 - 1000) / 500.0f); bf[i] = __bfloat162float(b[i]); }
    for (int i = 0; i < 128; i++) { c[i] = (rand() % 2001 - 1000) / 100.0f; }
    __nv_bfloat16 *da, *db;
    float *dc, *dd;
    cudaMalloc(&da, 256 * 2); cudaMalloc(&db, 128 * 2); cudaMalloc(&dc, 128 * 4); cudaMalloc(&dd, 128 * 4);
    cudaMemcpy(da, a.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), 256, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c.data(), 512, cudaMemcpyHostToDevice);
    for (int swap = 0; swap <= 1; swap++) {
        mma_kernel<<<1, 32>>>(dd, da, db, dc, swap);
        std::vector<float> d(128);
        cudaMemcpy(d.data(), dd, 512, cudaMemcpyDeviceToHost);
        double err = 0.0;
        for (int i = 0; i < 16; i++) {
            for (int j = 0; j < 8; j++) {
                double ref = c[i * 8 + j];
                for (int k = 0; k < 16; k++) { ref += (double)af[i * 16 + k] * bf[k * 8 + j]; }
                err = fmax(err, fabs(d[i * 8 + j] - ref));
            }
        }
        // exact bf16 products summed in fp32: 16 terms of size <= 4 and C <= 10, error < 1e-4
        if (swap == 0) { report("mma.sync m16n8k16 bf16 = double matmul (PTX ISA fragments)", err < 1e-4, fmt("max |err| %.2e", err)); }
        else { report("mma.sync with a1/a2 swapped gives a wrong product", err > 0.1, fmt("max |err| %.2e", err)); }
    }
    cudaFree(da); cudaFree(db); cudaFree(dc); cudaFree(dd);
}

// ---------------------------------------------------------------------------------------
// ldmatrix: four 8x8 bf16 matrices in shared memory, element value = 1000 i + 8 row + col

__global__ void ldmatrix_kernel(uint32_t* out, int mode) {
    extern __shared__ __nv_bfloat16 m[];   // 4 matrices x 8 rows x 16 (8 used + 8 padding)
    for (int i = threadIdx.x; i < 4 * 8 * 16; i += blockDim.x) {
        int mat = i / 128, row = (i / 16) % 8, col = i % 16;
        m[i] = __float2bfloat16_rn(col < 8 ? (float)(1000 * mat + 8 * row + col) / 4096.0f : -1.0f);
    }
    __syncthreads();
    int lane = threadIdx.x;
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(m + (lane / 8) * 128 + (lane % 8) * 16);
    uint32_t r[4] = {0, 0, 0, 0};
    if (mode == 0) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
    } else if (mode == 1) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
    } else if (mode == 2) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr) : "memory");
    }
    for (int i = 0; i < 4; i++) { out[lane * 4 + i] = r[i]; }
}

static void test_ldmatrix() {
    uint32_t* d;
    cudaMalloc(&d, 128 * 4);
    const char* names[] = {"ldmatrix x4", "ldmatrix x4.trans", "ldmatrix x2.trans", "ldmatrix x1"};
    int nmats[] = {4, 4, 2, 1};
    for (int mode = 0; mode < 4; mode++) {
        ldmatrix_kernel<<<1, 32, 4 * 8 * 16 * 2>>>(d, mode);
        std::vector<uint32_t> h(128);
        cudaMemcpy(h.data(), d, 512, cudaMemcpyDeviceToHost);
        int bad = 0, trans = mode == 1 || mode == 2;
        for (int lane = 0; lane < 32; lane++) {
            for (int i = 0; i < nmats[mode]; i++) {
                for (int e = 0; e < 2; e++) {
                    int row = trans ? 2 * (lane % 4) + e : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + e;
                    float want = (float)(1000 * i + 8 * row + col) / 4096.0f;
                    uint16_t bits = (uint16_t)(h[lane * 4 + i] >> (16 * e));
                    float got = __bfloat162float(__ushort_as_bfloat16(bits));
                    bad += got != __bfloat162float(__float2bfloat16_rn(want));
                }
            }
        }
        report(names[mode], bad == 0, fmt("%.0f elements misplaced", bad));
    }
    cudaFree(d);
}

// ---------------------------------------------------------------------------------------
// barriers and thread orders; shared memory poison; launch errors

__global__ void neighbour_kernel(float* out, int with_barrier) {
    __shared__ float s[256];
    s[threadIdx.x] = (float)threadIdx.x;
    if (with_barrier) { __syncthreads(); }
    out[threadIdx.x] = s[(threadIdx.x + 37) % blockDim.x] + s[(threadIdx.x + 200) % blockDim.x];
}

static void test_barriers() {
    float* d;
    cudaMalloc(&d, 256 * 4);
    for (int with = 1; with >= 0; with--) {
        std::string detail;
        int orders_wrong = 0;
        for (const char* o : ORDERS) {
            emu::set_order(o, 42);
            neighbour_kernel<<<2, 256>>>(d, with);
            std::vector<float> h(256);
            cudaMemcpy(h.data(), d, 1024, cudaMemcpyDeviceToHost);
            int bad = 0;
            for (int t = 0; t < 256; t++) { bad += h[t] != (float)((t + 37) % 256 + (t + 200) % 256); }
            orders_wrong += bad > 0;
            detail += std::string(o) + " " + std::to_string(bad) + " wrong; ";
        }
        if (with) { report("with __syncthreads: right in all three orders", orders_wrong == 0, detail); }
        else { report("without __syncthreads: wrong in forward and reverse order", orders_wrong >= 2, detail); }
    }
    emu::set_order("forward", 1);
    cudaFree(d);
}

__global__ void poison_kernel(float* out) {
    extern __shared__ float dyn[];
    __shared__ float stat[4];
    if (threadIdx.x == 0) { out[0] = dyn[5]; out[1] = stat[2]; dyn[5] = 1.0f; stat[2] = 1.0f; }
}

static void test_poison_and_errors() {
    float* d;
    cudaMalloc(&d, 8);
    bool ok = true;
    for (int rep = 0; rep < 2; rep++) {   // twice: the values written by the first launch must not survive
        poison_kernel<<<1, 32, 64>>>(d);
        float h[2];
        cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost);
        ok &= isnan(h[0]) && isnan(h[1]);
    }
    report("shared memory (dynamic and static) starts every block as NaN", ok, "");
    cudaGetLastError();
    poison_kernel<<<1, 1025>>>(d);
    cudaError_t e1 = cudaGetLastError();
    poison_kernel<<<1, 32, 64 * 1024>>>(d);
    cudaError_t e2 = cudaGetLastError();
    cudaFuncSetAttribute(poison_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
    poison_kernel<<<1, 32, 64 * 1024>>>(d);
    cudaError_t e3 = cudaGetLastError();
    report("1025 threads per block: cudaErrorInvalidConfiguration", e1 == cudaErrorInvalidConfiguration, cudaGetErrorString(e1));
    report("64 KiB of dynamic shared memory needs cudaFuncSetAttribute", e2 != cudaSuccess && e3 == cudaSuccess,
           std::string(cudaGetErrorString(e2)) + " / " + cudaGetErrorString(e3));
    cudaFree(d);
}

// ---------------------------------------------------------------------------------------
// failures that end the program: run in a child, check the exit status and the message

__global__ void divergent_barrier_kernel(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();   // half the block waits here...
    } else {
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);   // ...the other half at a shuffle
    }
}
__global__ void early_return_shuffle_kernel(float* out) {
    if (threadIdx.x % 32 >= 30) { return; }
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);   // names lanes that have returned
}
__global__ void out_of_bounds_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) { out[i] = 1.0f; }   // one past the end
}
__global__ void smem_out_of_bounds_kernel(float* out) {
    extern __shared__ float s[];
    s[threadIdx.x + 1] = 1.0f;   // 32 floats of shared memory, the last thread writes the 33rd
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

// ---------------------------------------------------------------------------------------
// streams: queued work, and the orders CUDA keeps between streams

__global__ void fill_kernel(int* p, int v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { p[i] = v; }
}
__global__ void copy_kernel(int* dst, const int* src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dst[i] = src[i]; }
}

static void test_streams() {
    const char* m = getenv("CUDAEMU_STREAMS");
    bool lazy = m == NULL || strcmp(m, "lazy") == 0;
    const int n = 64;
    int *a, *b;
    cudaMalloc(&a, n * sizeof(int));
    cudaMalloc(&b, n * sizeof(int));
    cudaStream_t nonblocking, blocking;
    cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking);
    cudaStreamCreate(&blocking);
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    // a launch is queued: the device memory (host memory here) changes when the host waits
    fill_kernel<<<1, n>>>(a, 1, n);
    int before = a[0];   // only the emulator may look at device memory this way
    cudaStreamSynchronize(0);
    int after = a[0];
    report("streams: a launch runs when the host waits for it", lazy ? before != 1 && after == 1 : after == 1,
           fmt("a[0] %g before the wait, %g after", before, after));
    // stream 0 writes a = 2; another stream copies a into b: which a does it see?
    const char* names[3] = {"non-blocking stream, no event: reads the old data", "non-blocking stream after an event: new data",
                            "blocking stream, no event: new data (ordered with stream 0)"};
    for (int mode = 0; mode < 3; mode++) {
        fill_kernel<<<1, n>>>(a, 1, n);
        fill_kernel<<<1, n>>>(b, 0, n);
        cudaDeviceSynchronize();
        fill_kernel<<<1, n>>>(a, 2, n);
        cudaStream_t s = mode == 2 ? blocking : nonblocking;
        if (mode == 1) {
            cudaEventRecord(ev, 0);
            cudaStreamWaitEvent(s, ev, 0);
        }
        copy_kernel<<<1, n, 0, s>>>(b, a, n);
        cudaStreamSynchronize(s);
        std::vector<int> h(n);
        cudaMemcpy(h.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost);
        int want = mode == 0 && lazy ? 1 : 2;
        bool ok = true;
        for (int i = 0; i < n; i++) { ok = ok && h[i] == want; }
        report(names[mode], ok, fmt(lazy ? "b[0] = %g, want %g" : "b[0] = %g, want %g (CUDAEMU_STREAMS=sync: all in issue order)", h[0], want));
    }
    cudaEventDestroy(ev);
    cudaStreamDestroy(nonblocking);
    cudaStreamDestroy(blocking);
    cudaFree(a);
    cudaFree(b);
}

// runs fn in a child process; returns its exit status (or 128 + signal) and its stderr
static int in_child(void (*fn)(), std::string* err) {
    int pipefd[2];
    if (pipe(pipefd) != 0) { return -1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 2);
        fn();
        _exit(0);
    }
    close(pipefd[1]);
    char buf[4096];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) { err->append(buf, (size_t)n); }
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// each waits for its kernel, as a program on a GPU must to see it fail (launches are queued)
static void run_divergent_barrier() { float* d; cudaMalloc(&d, 256); divergent_barrier_kernel<<<1, 32>>>(d); cudaDeviceSynchronize(); }
static void run_early_return() { float* d; cudaMalloc(&d, 256); early_return_shuffle_kernel<<<1, 32>>>(d); cudaDeviceSynchronize(); }
static void run_out_of_bounds() { float* d; cudaMalloc(&d, 100 * 4); out_of_bounds_kernel<<<4, 32>>>(d, 100); cudaDeviceSynchronize(); }
static void run_smem_out_of_bounds() {
    float* d;
    cudaMalloc(&d, 32 * 4);
    smem_out_of_bounds_kernel<<<1, 32, 32 * 4>>>(d);
    cudaDeviceSynchronize();
}

static void test_failures() {
    std::string err;
    int rc = in_child(run_divergent_barrier, &err);
    report("barrier and shuffle in divergent code: deadlock reported", rc == 1 && err.find("deadlock") != std::string::npos,
           "exit " + std::to_string(rc) + ": " + first_line(err));
    err.clear();
    rc = in_child(run_early_return, &err);
    report("shuffle naming returned lanes: reported", rc == 1 && err.find("already returned") != std::string::npos,
           "exit " + std::to_string(rc) + ": " + first_line(err));
#if defined(__SANITIZE_ADDRESS__)
    err.clear();
    rc = in_child(run_out_of_bounds, &err);
    report("ASan: a write past a cudaMalloc'd buffer is reported", rc != 0 && err.find("heap-buffer-overflow") != std::string::npos,
           "exit " + std::to_string(rc));
    err.clear();
    rc = in_child(run_smem_out_of_bounds, &err);
    report("ASan: a write past the dynamic shared memory is reported",
           rc != 0 && err.find("heap-buffer-overflow") != std::string::npos, "exit " + std::to_string(rc));
#else
    (void)run_out_of_bounds;
    (void)run_smem_out_of_bounds;
#endif
}

int main() {
    test_shuffles();
    test_mma();
    test_ldmatrix();
    test_barriers();
    test_poison_and_errors();
    test_streams();
    test_failures();
    return failures ? 1 : 0;
}
