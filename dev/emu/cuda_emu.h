// The device side of CUDA, executed on the CPU (dev/emu/README.md has the whole picture).
//
// A kernel launch runs every CUDA thread of a block as a fiber (a small stack and a saved
// stack pointer; runtime.cpp switches between them in a few nanoseconds). A thread runs
// until it must wait for others (__syncthreads, a shuffle, an mma): then the next one runs.
// When every live thread of the block waits at the barrier, or every lane of the warp has
// reached the shuffle, they are released. The blocks of a grid run one after the other.
//
//   kernel<<<grid, block, smem, stream>>>(args)   is rewritten by cudaemu.py into
//   ::emu::launch(::emu::Config(grid, block, smem, stream), kernel, args)
//
// The launch is queued on its stream and runs when something waits for it (a synchronising
// call, a blocking copy, work ordered after it): runtime.cpp's "Streams".
//
// What a kernel sees here:
//   threadIdx, blockIdx, blockDim, gridDim   the running fiber's
//   __syncthreads, __syncwarp                barriers (a deadlock is reported, not hung)
//   __shfl_*_sync, __ballot/any/all_sync     warp collectives: every lane of the mask must arrive
//   mma.sync m16n8k16 bf16, ldmatrix x4      warp-wide functions following the PTX ISA's fragment
//                                            layouts (emu_ptx.h); any other asm fails to compile
//   atomicAdd, atomicMax, ...                plain read-modify-write (one host thread runs a block)
//   math: rsqrtf, __expf, __fdividef, ...    host libm (numerics differ in the last bits)
// Memory is sequentially consistent; races between blocks and weak ordering are not modelled.
#pragma once

#include <stdint.h>
#include <string.h>
#include <math.h>
#include <algorithm>
#include <tuple>
#include <utility>
#include <cuda_runtime.h>

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace emu {

// ---- the running thread (set by the scheduler before it switches to a fiber)
struct ThreadState {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};
extern ThreadState current;

// ---- scheduler entry points (runtime.cpp)
void sync_block();                                        // __syncthreads
void sync_warp(unsigned mask);                            // __syncwarp
// A warp collective: every lane of `mask` deposits `in_bytes` of its own data, waits for the
// others, then `out` (its own lane's result, computed by `fn` from all lanes' deposits) is
// returned. kind names the operation for the divergence diagnostics.
typedef void (*WarpFn)(const void* deposits, int stride, int lane, void* out, const void* arg);
void warp_collective(const char* kind, unsigned mask, const void* in, int in_bytes, void* out, WarpFn fn,
                     const void* arg);
void* dynamic_smem();                                     // extern __shared__ arrays
uint32_t shared_offset(const void* p);                    // __cvta_generic_to_shared
void* shared_pointer(uint32_t offset);
void poison_shared(void* p, size_t bytes);                // once per block, for static __shared__
[[noreturn]] void trap(const char* what);
// the order threads run in (what CUDAEMU_ORDER sets): "forward", "reverse" or "random"
void set_order(const char* order, unsigned seed);

// ---- launches
struct Config {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    Config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), smem(s), stream(st) {}
};
typedef void (*Body)(void* ctx);
// Queues the grid on cfg.stream (runtime.cpp, "Streams": it runs when something waits for it).
// A refused configuration sets the error cudaGetLastError returns and queues nothing. ctx
// belongs to the launch: drop(ctx) releases it once the grid has run (or was refused).
void submit_grid(const Config& cfg, const void* kernel, Body body, void* ctx, Body drop);

template <class... P, class... A>
inline void launch(const Config& cfg, void (*kernel)(P...), A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    // the arguments are converted to the parameter types once, as a real launch copies them
    struct Ctx {
        void (*k)(P...);
        std::tuple<typename std::decay<P>::type...> params;
    };
    Ctx* ctx = new Ctx{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
    submit_grid(cfg, (const void*)kernel, [](void* p) {
        Ctx* c = (Ctx*)p;
        std::apply(c->k, c->params);
    }, ctx, [](void* p) { delete (Ctx*)p; });
}

// ---- warp shuffles on any 4- or 8-byte value
template <class T> struct ShflArg { int mode; int lane_arg; int width; };
template <class T>
inline void shfl_compute(const void* deposits, int stride, int lane, void* out, const void* arg) {
    const ShflArg<T>* a = (const ShflArg<T>*)arg;
    int w = a->width, base = lane & ~(w - 1), src = lane;   // width: a power of two <= 32
    if (a->mode == 0) { src = base + (a->lane_arg & (w - 1)); }                            // __shfl_sync
    else if (a->mode == 1) { src = lane ^ a->lane_arg; if (src >= base + w) { src = lane; } }   // xor
    else if (a->mode == 2) { src = lane + a->lane_arg; if (src >= base + w) { src = lane; } }   // down
    else { src = lane - a->lane_arg; if (src < base) { src = lane; } }                         // up
    memcpy(out, (const char*)deposits + (size_t)src * stride, sizeof(T));
}
template <class T> inline T shfl(const char* kind, int mode, unsigned mask, T v, int lane_arg, int width) {
    static_assert(sizeof(T) <= 16, "shuffle of a value larger than 16 bytes");
    ShflArg<T> a{mode, lane_arg, width};
    T out;
    warp_collective(kind, mask, &v, (int)sizeof(T), &out, shfl_compute<T>, &a);
    return out;
}
struct VoteArg { int mode; unsigned mask; };
void vote_compute(const void* deposits, int stride, int lane, void* out, const void* arg);

}  // namespace emu

#define threadIdx (::emu::current.thread_idx)
#define blockIdx (::emu::current.block_idx)
#define blockDim (::emu::current.block_dim)
#define gridDim (::emu::current.grid_dim)
static const int warpSize = 32;

inline void __syncthreads() { ::emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::emu::sync_warp(mask); }
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) { return ::emu::shfl("__shfl_sync", 0, mask, v, src, width); }
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) { return ::emu::shfl("__shfl_xor_sync", 1, mask, v, m, width); }
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) { return ::emu::shfl("__shfl_down_sync", 2, mask, v, (int)d, width); }
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) { return ::emu::shfl("__shfl_up_sync", 3, mask, v, (int)d, width); }
inline unsigned emu_vote(const char* kind, int mode, unsigned mask, int pred) {
    ::emu::VoteArg a{mode, mask};
    int p = pred != 0;
    unsigned out = 0;
    ::emu::warp_collective(kind, mask, &p, (int)sizeof(int), &out, ::emu::vote_compute, &a);
    return out;
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return emu_vote("__ballot_sync", 0, mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return (int)emu_vote("__any_sync", 1, mask, pred); }
inline int __all_sync(unsigned mask, int pred) { return (int)emu_vote("__all_sync", 2, mask, pred); }
inline unsigned __activemask() { return 0xffffffffu; }

[[noreturn]] inline void __trap() { ::emu::trap("__trap() called"); }
inline void __threadfence() {}
inline void __threadfence_block() {}
inline uint32_t __cvta_generic_to_shared(const void* p) { return ::emu::shared_offset(p); }

// ---- bit casts and fast math (host libm; the GPU's approximate versions differ in the last bits)
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

// ---- atomics: one host thread runs a block at a time and fibers switch only at barriers and
// warp collectives, so a plain read-modify-write is atomic here
template <class T> inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <class T> inline T atomicSub(T* p, T v) { T old = *p; *p = old - v; return old; }
template <class T> inline T atomicMax(T* p, T v) { T old = *p; *p = old > v ? old : v; return old; }
template <class T> inline T atomicMin(T* p, T v) { T old = *p; *p = old < v ? old : v; return old; }
template <class T> inline T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
template <class T> inline T atomicCAS(T* p, T cmp, T v) { T old = *p; if (old == cmp) { *p = v; } return old; }

#include "emu_ptx.h"

// cudaFuncSetAttribute on a kernel (the toolkit's template overload exists only under nvcc)
template <class... P>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void*)kernel, attr, value);
}
