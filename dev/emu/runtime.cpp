// The emulator's runtime (dev/emu/README.md): fibers and the block scheduler behind every
// kernel launch, the CUDA runtime calls on host memory, cuBLASLt/cuBLAS as a reference GEMM,
// and NCCL calls that refuse to run.
//
// Scheduling one block of n threads:
//   every thread is a fiber; the scheduler visits the threads in an order (forward, reverse
//   or random: CUDAEMU_ORDER) and switches to each one that can run. A thread runs until it
//   finishes or waits (block barrier or warp collective), then switches back. A barrier is
//   released by the last thread to arrive; when a full pass finds nothing to run while some
//   threads still wait, the block is deadlocked: the waits are reported and the program stops.
// A missing __syncthreads shows up because a thread runs ahead as far as it can: in forward
// order the first threads read shared memory the later ones have not written yet, in reverse
// order the other way round. Shared memory starts every block as NaN (bytes 0xff).
// Cost: one context switch (~10 ns) per thread per launch, per barrier and per collective.
//
// Streams: a launch, an asynchronous copy or memset, a GEMM and an event record are queued on
// their stream and run as late as CUDA allows ("Streams" below), so a missing synchronisation
// or event between streams shows up as stale data, as it may on a GPU.
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>
#include <map>
#include <memory>
#include <random>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <nccl.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/asan_interface.h>
#define EMU_ASAN 1
#endif

namespace emu {

ThreadState current;

[[noreturn]] static void fatal(const char* fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

// ---------------------------------------------------------------------------------------
// Fibers. x86-64: a hand-written switch that saves the callee-saved registers and the stack
// pointer (the SysV ABI lets a call clobber the rest; no kernel changes the rounding mode, so
// the SSE and x87 control words are not switched). Elsewhere: ucontext (about 20 times slower).

#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
extern "C" void emu_ctx_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.globl emu_ctx_switch
.type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_ctx_switch, .-emu_ctx_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#else
#include <ucontext.h>
#endif

struct Stack {
    char* base;   // lowest usable byte (a guard page lies below it)
    size_t size;
    size_t color; // bytes left unused at the top, different per stack: the stacks' tops would
                  // otherwise share their low address bits and fight over the same cache sets
};

#ifdef EMU_ASAN
static const size_t STACK_BYTES = 512 * 1024;   // ASan's redzones make frames larger
#else
static const size_t STACK_BYTES = 128 * 1024;
#endif
static std::vector<Stack> free_stacks;

static Stack stack_get() {
    if (!free_stacks.empty()) {
        Stack s = free_stacks.back();
        free_stacks.pop_back();
        return s;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char* p = (char*)mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { fatal("cannot map a fiber stack"); }
    if (mprotect(p, page, PROT_NONE) != 0) { fatal("cannot protect a fiber stack's guard page"); }
    static size_t made = 0;
    made++;
    return Stack{p + page, STACK_BYTES, (made * 37 % 64) * 64};
}

enum { T_NEW, T_RUNNABLE, T_WAIT_BLOCK, T_WAIT_WARP, T_DONE };

struct Thread {
    void* sp;           // saved stack pointer while switched out
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
    ucontext_t uc;
#endif
    Stack stack;
    uint3 idx;
    int warp, lane, state;
    const char* wait_what;   // for the deadlock report
};

struct Warp {
    int nlanes;              // lanes that exist (the last warp of a block may be partial)
    unsigned exists;         // their mask
    unsigned exited;         // lanes that returned
    unsigned arrived;        // lanes waiting at the current collective
    unsigned mask;           // the current collective's mask
    const char* kind;        // the current collective's name
    unsigned gen;            // collectives completed; deposits alternate between two slots
    alignas(16) unsigned char slot[2][32][32];
};

struct Block {
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    int live, arrived;       // threads not finished; threads waiting at __syncthreads
    unsigned char* smem;     // dynamic shared memory
    size_t smem_bytes;
    std::vector<void*> poisoned;   // static __shared__ variables already poisoned in this block
} blk;

static Thread* cur = NULL;
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
static void* sched_sp = NULL;   // the scheduler's stack pointer while a fiber runs
#else
static ucontext_t sched_uc;     // (-DEMU_UCONTEXT tries this portable path on x86-64 too)
#endif
#ifdef EMU_ASAN
static const void* sched_stack_bottom = NULL;
static size_t sched_stack_size = 0;
#endif

static void* kernel_ctx = NULL;
static Body kernel_body = NULL;

static void fiber_main();

// switch from the scheduler into thread t
static void switch_in(Thread* t) {
    cur = t;
    current.thread_idx = t->idx;
#ifdef EMU_ASAN
    void* fake = NULL;
    __sanitizer_start_switch_fiber(&fake, t->stack.base, t->stack.size);
#endif
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    emu_ctx_switch(&sched_sp, t->sp);
#else
    swapcontext(&sched_uc, &t->uc);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
    cur = NULL;
}

// switch from the running fiber back to the scheduler (finished: its stack is not kept)
static void switch_out(bool finished) {
    Thread* t = cur;
#ifdef EMU_ASAN
    void* fake = NULL;
    __sanitizer_start_switch_fiber(finished ? NULL : &fake, sched_stack_bottom, sched_stack_size);
#endif
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    emu_ctx_switch(&t->sp, sched_sp);
#else
    swapcontext(&t->uc, &sched_uc);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &sched_stack_bottom, &sched_stack_size);
#endif
    (void)finished;
    current.thread_idx = t->idx;
}

static void fiber_start(Thread* t) {
    t->stack = stack_get();
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    // the frame emu_ctx_switch pops: r15..r12, rbx, rbp, then "return" into fiber_main with
    // the stack aligned as after a call
    uintptr_t top = ((uintptr_t)(t->stack.base + t->stack.size - t->stack.color)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = NULL;                        // fiber_main's return address (it never returns)
    *--sp = (void*)&fiber_main;
    for (int i = 0; i < 6; i++) { *--sp = NULL; }   // rbp, rbx, r12..r15
    t->sp = sp;
#else
    getcontext(&t->uc);
    t->uc.uc_stack.ss_sp = t->stack.base;
    t->uc.uc_stack.ss_size = t->stack.size;
    t->uc.uc_link = NULL;
    makecontext(&t->uc, fiber_main, 0);
#endif
    t->state = T_RUNNABLE;
}

static void thread_exit(Thread* next);
static Thread* thread_finish();

// Where run_block's scheduler is: the warp it runs, the lane order, and the position in it of
// the thread now running. A thread that returns hands its fiber to the next thread the scheduler
// would start (thread_finish), without a switch: a kernel with no barrier and no warp collective
// runs a whole warp on one fiber, in the same order as thread by thread.
static int sched_warp = 0;
static int sched_pos = 0;
static const std::vector<int>* sched_lanes = NULL;

static void fiber_main() {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &sched_stack_bottom, &sched_stack_size);
#endif
    for (;;) {
        kernel_body(kernel_ctx);
        Thread* next = thread_finish();
        if (next == NULL || next->state != T_NEW) { thread_exit(next); }
        next->stack = cur->stack;   // the finished thread's fiber, stack and all, is the next one's
        next->state = T_RUNNABLE;
        cur = next;
        current.thread_idx = next->idx;
    }
}

// ---------------------------------------------------------------------------------------
// Barriers and warp collectives

static void release_block_barrier() {
    for (Thread& t : blk.threads) {
        if (t.state == T_WAIT_BLOCK) { t.state = T_RUNNABLE; }
    }
    blk.arrived = 0;
}

static void release_warp(Warp& w, int warp) {
    int first = warp * 32;
    for (int l = 0; l < w.nlanes; l++) {
        Thread& t = blk.threads[first + l];
        if (t.state == T_WAIT_WARP) { t.state = T_RUNNABLE; }
    }
    w.arrived = 0;
    w.kind = NULL;
    w.gen++;
}

// Direct switches (x86-64, not under ASan, whose fiber annotations assume the scheduler in
// between): a thread that waits or returns passes the core straight to the thread the scheduler
// would run next in this warp, the same thread in the same order, one switch instead of two.
#if defined(__x86_64__) && !defined(EMU_UCONTEXT) && !defined(EMU_ASAN)
#define EMU_DIRECT 1
#endif

// the thread the scheduler would run next in this warp (not started yet, or runnable), after the
// position of the one running; NULL when it would go back to the start of the warp
static Thread* next_in_warp(int warp) {
#ifdef EMU_DIRECT
    if (sched_lanes == NULL || warp != sched_warp) { return NULL; }
    Warp& w = blk.warps[warp];
    for (int pos = sched_pos + 1; pos < 32; pos++) {
        int l = (*sched_lanes)[pos];
        if (l >= w.nlanes) { continue; }
        Thread& n = blk.threads[warp * 32 + l];
        if (n.state == T_NEW || n.state == T_RUNNABLE) {
            sched_pos = pos;
            return &n;
        }
    }
#endif
    (void)warp;
    return NULL;
}

// the running thread t (marked waiting) gives the core to the next one in its warp, or back to
// the scheduler; it continues here when something switches back to it
static void suspend(Thread* t) {
#ifdef EMU_DIRECT
    Thread* n = next_in_warp(t->warp);
    if (n != NULL) {
        if (n->state == T_NEW) { fiber_start(n); }
        cur = n;
        current.thread_idx = n->idx;
        emu_ctx_switch(&t->sp, n->sp);
        cur = t;
        current.thread_idx = t->idx;
        return;
    }
#endif
    (void)t;
    switch_out(false);
}

// The running thread has returned from the kernel: it is done. Returns the thread the scheduler
// would run next in this warp (NULL: back to the scheduler); one not started yet runs on this fiber.
static Thread* thread_finish() {
    Thread* t = cur;
    t->state = T_DONE;
    blk.live--;
    Warp& w = blk.warps[t->warp];
    w.exited |= 1u << t->lane;
    if (w.arrived != 0 && (w.mask & (1u << t->lane))) {
        fatal("%s in block (%u,%u,%u) warp %d: lanes 0x%08x wait for lane %d, which has already returned "
              "(a collective in divergent code)", w.kind, current.block_idx.x, current.block_idx.y, current.block_idx.z,
              t->warp, w.arrived, t->lane);
    }
    if (blk.arrived > 0 && blk.arrived == blk.live) { release_block_barrier(); }
    return next_in_warp(t->warp);
}

// the running thread's fiber ends (its stack goes back to the pool); next (runnable) or the
// scheduler goes on
static void thread_exit(Thread* next) {
    free_stacks.push_back(cur->stack);   // reused by the next thread that starts (after we left it)
#ifdef EMU_DIRECT
    if (next != NULL) {
        static void* dead_sp;
        cur = next;
        current.thread_idx = next->idx;
        emu_ctx_switch(&dead_sp, next->sp);
    }
#endif
    (void)next;
    switch_out(true);
    fatal("a finished fiber was resumed");
}

void sync_block() {
    if (cur == NULL) { fatal("__syncthreads called outside a kernel"); }
    blk.arrived++;
    if (blk.arrived == blk.live) {
        release_block_barrier();
        return;
    }
    cur->state = T_WAIT_BLOCK;
    cur->wait_what = "__syncthreads";
    suspend(cur);
}

void warp_collective(const char* kind, unsigned mask, const void* in, int in_bytes, void* out, WarpFn fn,
                     const void* arg) {
    if (cur == NULL) { fatal("%s called outside a kernel", kind); }
    Thread* t = cur;
    Warp& w = blk.warps[t->warp];
    unsigned me = 1u << t->lane;
    unsigned need = mask & w.exists;
    if (!(mask & me)) { fatal("%s: lane %d calls it with mask 0x%08x, which does not name the lane itself", kind, t->lane, mask); }
    if (in_bytes > 32) { fatal("%s: %d bytes per lane (at most 32)", kind, in_bytes); }
    if (w.arrived == 0) {
        w.kind = kind;
        w.mask = mask;
    } else if (w.kind != kind && strcmp(w.kind, kind) != 0) {
        fatal("divergent warp: in block (%u,%u,%u) warp %d, lane %d reached %s while lanes 0x%08x wait at %s",
              current.block_idx.x, current.block_idx.y, current.block_idx.z, t->warp, t->lane, kind, w.arrived, w.kind);
    } else if (w.mask != mask) {
        fatal("%s in block (%u,%u,%u) warp %d: lane %d gives mask 0x%08x, others 0x%08x", kind, current.block_idx.x,
              current.block_idx.y, current.block_idx.z, t->warp, t->lane, mask, w.mask);
    }
    if (need & w.exited) {
        fatal("%s in block (%u,%u,%u) warp %d: the mask 0x%08x names lanes that have already returned (0x%08x): "
              "a collective in divergent code", kind, current.block_idx.x, current.block_idx.y, current.block_idx.z,
              t->warp, mask, need & w.exited);
    }
    unsigned parity = w.gen & 1;
    if (in_bytes > 0) { memcpy(w.slot[parity][t->lane], in, (size_t)in_bytes); }
    w.arrived |= me;
    if ((w.arrived & need) == need) {
        release_warp(w, t->warp);
    } else {
        t->state = T_WAIT_WARP;
        t->wait_what = kind;
        suspend(t);
    }
    if (fn) { fn(&w.slot[parity][0][0], 32, t->lane, out, arg); }
}

void sync_warp(unsigned mask) { warp_collective("__syncwarp", mask, NULL, 0, NULL, NULL, NULL); }

void vote_compute(const void* deposits, int stride, int lane, void* out, const void* arg) {
    (void)lane;
    const VoteArg* a = (const VoteArg*)arg;
    unsigned need = a->mask & blk.warps[cur->warp].exists;   // the lanes that took part
    unsigned ballot = 0;
    for (int i = 0; i < 32; i++) {
        int p;
        memcpy(&p, (const char*)deposits + (size_t)i * stride, sizeof(int));
        if (((need >> i) & 1) && p) { ballot |= 1u << i; }
    }
    unsigned r = ballot;
    if (a->mode == 1) { r = ballot != 0; }
    if (a->mode == 2) { r = ballot == need; }
    memcpy(out, &r, sizeof(r));
}

void* dynamic_smem() {
    if (blk.smem == NULL) { trap("extern __shared__ memory used by a kernel launched with 0 bytes of it"); }
    return blk.smem;
}
uint32_t shared_offset(const void* p) {
    const unsigned char* c = (const unsigned char*)p;
    if (blk.smem == NULL || c < blk.smem || c > blk.smem + blk.smem_bytes) {
        trap("__cvta_generic_to_shared: only dynamic (extern __shared__) memory is addressable here");
    }
    return (uint32_t)(c - blk.smem);
}
void* shared_pointer(uint32_t offset) {
    if (offset + 16 > blk.smem_bytes) { trap("a shared-memory address past the end of the block's dynamic shared memory"); }
    return blk.smem + offset;
}
void poison_shared(void* p, size_t bytes) {
    for (void* q : blk.poisoned) { if (q == p) { return; } }
    blk.poisoned.push_back(p);
    memset(p, 0xff, bytes);
}

void trap(const char* what) {
    fatal("%s (block (%u,%u,%u), thread (%u,%u,%u))", what, current.block_idx.x, current.block_idx.y,
          current.block_idx.z, current.thread_idx.x, current.thread_idx.y, current.thread_idx.z);
}

// ---------------------------------------------------------------------------------------
// Launches

static cudaError_t last_error = cudaSuccess;
static std::map<const void*, int> max_dynamic_smem;   // cudaFuncSetAttribute
static std::mutex launch_mutex;   // a host thread (e.g. a communication thread) launches too
static int order_mode = -1;       // 0 forward, 1 reverse, 2 random
static std::mt19937 order_rng;
static long long launches = 0;

static void read_order() {
    const char* o = getenv("CUDAEMU_ORDER");
    order_mode = 0;
    if (o == NULL || strcmp(o, "forward") == 0) { order_mode = 0; }
    else if (strcmp(o, "reverse") == 0) { order_mode = 1; }
    else if (strcmp(o, "random") == 0) { order_mode = 2; }
    else { fatal("CUDAEMU_ORDER='%s': expected forward, reverse or random", o); }
    const char* s = getenv("CUDAEMU_SEED");
    order_rng.seed(s ? (unsigned)strtoul(s, NULL, 10) : 1234u);
}

static void sync_device();

void set_order(const char* order, unsigned seed) {
    sync_device();   // the launches queued so far run in the order in force when they were made
    std::lock_guard<std::mutex> lock(launch_mutex);
    if (strcmp(order, "forward") == 0) { order_mode = 0; }
    else if (strcmp(order, "reverse") == 0) { order_mode = 1; }
    else if (strcmp(order, "random") == 0) { order_mode = 2; }
    else { fatal("set_order('%s'): expected forward, reverse or random", order); }
    order_rng.seed(seed);
}

static void report_deadlock() {
    fflush(stdout);
    fprintf(stderr, "cuda emulator: deadlock in block (%u,%u,%u) of a %ux%ux%u grid (blockDim %ux%ux%u): no thread can run\n",
            current.block_idx.x, current.block_idx.y, current.block_idx.z, current.grid_dim.x, current.grid_dim.y,
            current.grid_dim.z, current.block_dim.x, current.block_dim.y, current.block_dim.z);
    int shown = 0;
    for (size_t w = 0; w < blk.warps.size() && shown < 8; w++) {
        Warp& wp = blk.warps[w];
        int nb = 0, nw = 0, nd = 0;
        const char* what = "";
        for (int l = 0; l < wp.nlanes; l++) {
            Thread& t = blk.threads[w * 32 + l];
            if (t.state == T_WAIT_BLOCK) { nb++; }
            if (t.state == T_WAIT_WARP) { nw++; what = t.wait_what; }
            if (t.state == T_DONE) { nd++; }
        }
        if (nb + nw == 0) { continue; }
        fprintf(stderr, "  warp %zu: %d lanes at __syncthreads, %d at %s (mask 0x%08x, arrived 0x%08x), %d returned\n", w, nb,
                nw, nw ? what : "-", wp.mask, wp.arrived, nd);
        shown++;
    }
    fprintf(stderr, "  (a barrier or warp collective in divergent code: not every thread it waits for can reach it)\n");
    exit(1);
}

// Runs one block. Warp by warp: a warp's lanes run until every one of them waits at
// __syncthreads or has finished (through as many shuffles as they meet), then the next warp
// runs. A warp thus gets as far ahead of the others as the barriers allow, which is what
// exposes a missing __syncthreads (e.g. shared scratch reused before the other warps have read
// it). The order of the warps and of the lanes within one is forward, reverse or random.
static void run_block(int nthreads, std::vector<int>& warp_order, std::vector<int>& lane_order) {
    blk.live = nthreads;
    blk.arrived = 0;
    blk.poisoned.clear();
    if (blk.smem) { memset(blk.smem, 0xff, blk.smem_bytes); }
    for (int i = 0; i < nthreads; i++) {
        Thread& t = blk.threads[i];
        t.state = T_NEW;
        t.wait_what = NULL;
    }
    for (size_t w = 0; w < blk.warps.size(); w++) {
        Warp& wp = blk.warps[w];
        wp.exited = 0;
        wp.arrived = 0;
        wp.kind = NULL;
        wp.gen = 0;
    }
    while (blk.live > 0) {
        if (order_mode == 2) {
            std::shuffle(warp_order.begin(), warp_order.end(), order_rng);
            std::shuffle(lane_order.begin(), lane_order.end(), order_rng);
        }
        bool progress = false;
        for (int w : warp_order) {
            bool again = true;
            while (again) {
                again = false;
                for (int pos = 0; pos < 32; pos++) {
                    int l = lane_order[pos];
                    if (l >= blk.warps[w].nlanes) { continue; }
                    Thread* t = &blk.threads[w * 32 + l];
                    if (t->state == T_NEW) { fiber_start(t); }
                    if (t->state != T_RUNNABLE) { continue; }
                    sched_warp = w;
                    sched_pos = pos;
                    sched_lanes = &lane_order;
                    switch_in(t);
                    pos = sched_pos;   // threads started on its fiber after it ran up to here
                    t = &blk.threads[w * 32 + lane_order[pos]];
                    again = progress = true;
#ifdef EMU_ASAN
                    if (t->state == T_DONE) {   // the frames still live on its stack at exit leave poisoned shadow
                        char* top = t->stack.base + t->stack.size;
                        char* low = (char*)t->sp - 256 > t->stack.base ? (char*)t->sp - 256 : t->stack.base;
                        ASAN_UNPOISON_MEMORY_REGION(low, (size_t)(top - low));
                    }
#endif
                }
            }
        }
        if (!progress && blk.live > 0) { report_deadlock(); }
    }
}

// runs a grid whose configuration submit_grid has accepted
static void run_grid(const Config& cfg, Body body, void* ctx) {
    std::lock_guard<std::mutex> lock(launch_mutex);
    if (order_mode < 0) { read_order(); }
    dim3 g = cfg.grid, b = cfg.block;
    size_t nthreads = (size_t)b.x * b.y * b.z;
    launches++;
    current.grid_dim = g;
    current.block_dim = b;
    kernel_body = body;
    kernel_ctx = ctx;
    int nwarps = (int)((nthreads + 31) / 32);
    blk.threads.assign(nthreads, Thread());
    blk.warps.assign(nwarps, Warp());
    for (size_t i = 0; i < nthreads; i++) {
        Thread& t = blk.threads[i];
        t.idx = make_uint3((unsigned)(i % b.x), (unsigned)((i / b.x) % b.y), (unsigned)(i / ((size_t)b.x * b.y)));
        t.warp = (int)(i / 32);
        t.lane = (int)(i % 32);
    }
    std::vector<int> warp_order(nwarps), lane_order(32);
    for (int w = 0; w < nwarps; w++) { warp_order[w] = order_mode == 1 ? nwarps - 1 - w : w; }
    for (int l = 0; l < 32; l++) { lane_order[l] = order_mode == 1 ? 31 - l : l; }
    for (int w = 0; w < nwarps; w++) {
        int n = (int)std::min<size_t>(32, nthreads - (size_t)w * 32);
        blk.warps[w].nlanes = n;
        blk.warps[w].exists = n == 32 ? 0xffffffffu : ((1u << n) - 1);
    }
    blk.smem_bytes = cfg.smem;
    blk.smem = NULL;
    if (cfg.smem > 0) {
        void* p = NULL;
        if (posix_memalign(&p, 128, cfg.smem) != 0) { fatal("out of host memory for shared memory"); }
        blk.smem = (unsigned char*)p;
    }
    size_t nblocks = (size_t)g.x * g.y * g.z;
    for (size_t k = 0; k < nblocks; k++) {
        size_t bi = order_mode == 1 ? nblocks - 1 - k : k;   // blocks in the same order as threads
        current.block_idx = make_uint3((unsigned)(bi % g.x), (unsigned)((bi / g.x) % g.y), (unsigned)(bi / ((size_t)g.x * g.y)));
        run_block((int)nthreads, warp_order, lane_order);
    }
    free(blk.smem);
    blk.smem = NULL;
    blk.smem_bytes = 0;
}

static void enqueue(cudaStream_t h, std::function<void()> fn);

// The configuration is checked at launch, as on the GPU (cudaGetLastError right after the
// launch reports it); the grid runs when its stream gets to it.
void submit_grid(const Config& cfg, const void* kernel, Body body, void* ctx, Body drop) {
    std::shared_ptr<void> owned(ctx, drop);   // released when the queued work goes (run or not), or at once if refused
    dim3 g = cfg.grid, b = cfg.block;
    size_t nthreads = (size_t)b.x * b.y * b.z;
    int limit = 48 * 1024;
    {
        std::lock_guard<std::mutex> lock(launch_mutex);
        auto it = max_dynamic_smem.find(kernel);
        if (it != max_dynamic_smem.end()) { limit = it->second; }
    }
    if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0 || nthreads > 1024 || b.z > 64 ||
        g.y > 65535 || g.z > 65535 || g.x > 2147483647u) {
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (cfg.smem > (size_t)limit) {   // above 48 KiB needs cudaFuncSetAttribute, as on the GPU
        last_error = cudaErrorInvalidValue;
        return;
    }
    Config c = cfg;
    enqueue(cfg.stream, [c, body, owned] { run_grid(c, body, owned.get()); });
}

// ---------------------------------------------------------------------------------------
// Device memory: host memory, remembered so that cudaPointerGetAttributes can tell it apart.

static std::mutex mem_mutex;
static std::map<uintptr_t, size_t> device_allocs;   // start -> bytes
static std::map<uintptr_t, size_t> pinned_allocs;
static size_t device_bytes_in_use = 0;
static const size_t DEVICE_BYTES = (size_t)16 << 30;   // what cudaMemGetInfo reports as the total

static bool find_alloc(std::map<uintptr_t, size_t>& m, const void* p) {
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin()) { return false; }
    --it;
    return a >= it->first && a < it->first + (it->second ? it->second : 1);
}
// plain host memory: neither cudaMalloc'd nor pinned (cudaMallocHost)
static bool pageable(const void* p) {
    std::lock_guard<std::mutex> lock(mem_mutex);
    return !find_alloc(device_allocs, p) && !find_alloc(pinned_allocs, p);
}

// ---------------------------------------------------------------------------------------
// Streams. Every piece of device work (a launch, an asynchronous copy or memset, a GEMM, an
// event record) is queued on its stream and runs as late as CUDA allows: when the host waits
// for it (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a copy to or from
// plain host memory, cudaFree) or when work ordered after it has to run. The orders kept are
// CUDA's, no more:
//   - a stream runs its work in the order it was issued;
//   - cudaStreamWaitEvent(s, e): what s is given afterwards waits for the work before e;
//   - the legacy default stream (stream 0): its work waits for everything issued before it on
//     the blocking streams (cudaStreamCreate), and their work for everything issued before it
//     on stream 0; a stream made with cudaStreamNonBlocking is not ordered with stream 0.
// So a program that reads results without waiting for the stream that makes them, or uses on
// one stream what another stream has not written yet (a missing event), reads the old
// contents, as a GPU may let it. Work still runs one piece at a time, in whichever host thread
// waits for it: no concurrency and no timing. CUDAEMU_STREAMS=sync runs every piece when it is
// issued (every call synchronous, as the emulator did before it had streams).

struct Stream;
struct Op {
    std::function<void()> fn;
    std::vector<std::pair<Stream*, uint64_t>> after;   // run these streams up to these counts first
};
struct Stream {
    std::deque<Op> q;
    uint64_t issued = 0, done = 0;   // pieces of work issued, run
    bool blocking = true;            // ordered with the legacy default stream
    bool running = false;
};
struct EmuEvent {
    double t;         // host time when its record ran
    Stream* stream;   // where it was last recorded (NULL: never, or that stream is gone and done)
    uint64_t seq;     // the work of that stream it stands for
};
static std::recursive_mutex stream_mutex;      // queues, and the work run from them
static Stream legacy_stream;
static std::vector<Stream*> live_streams;      // created, not destroyed
static std::vector<EmuEvent*> live_events;
static int streams_lazy = -1;
static const size_t MAX_QUEUED = 4096;         // a longer queue is run (a program that never waits)

static Stream* stream_of(cudaStream_t h) {
    if (h == 0 || h == cudaStreamLegacy || h == cudaStreamPerThread) { return &legacy_stream; }   // per-thread: as legacy
    return (Stream*)h;
}

static void run_until(Stream* s, uint64_t k) {
    if (s->running && k > s->done) { fatal("stream work waits for work issued after it (emulator bug)"); }
    while (s->done < k) {
        Op op = std::move(s->q.front());
        s->q.pop_front();
        s->running = true;
        for (auto& a : op.after) { run_until(a.first, a.second); }   // issued earlier: no cycle
        op.fn();
        s->running = false;
        s->done++;
    }
}

static void enqueue_after(cudaStream_t h, std::function<void()> fn, std::vector<std::pair<Stream*, uint64_t>> after) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    if (streams_lazy < 0) {
        const char* m = getenv("CUDAEMU_STREAMS");
        if (m != NULL && strcmp(m, "sync") != 0 && strcmp(m, "lazy") != 0) { fatal("CUDAEMU_STREAMS='%s': expected lazy or sync", m); }
        streams_lazy = m == NULL || strcmp(m, "lazy") == 0;
    }
    Stream* s = stream_of(h);
    if (s == &legacy_stream) {
        for (Stream* o : live_streams) {
            if (o->blocking && o->issued > o->done) { after.push_back({o, o->issued}); }
        }
    } else if (s->blocking && legacy_stream.issued > legacy_stream.done) {
        after.push_back({&legacy_stream, legacy_stream.issued});
    }
    s->q.push_back(Op{std::move(fn), std::move(after)});
    s->issued++;
    if (!streams_lazy || s->q.size() > MAX_QUEUED) { run_until(s, s->issued); }
}
static void enqueue(cudaStream_t h, std::function<void()> fn) { enqueue_after(h, std::move(fn), {}); }

static void sync_stream(cudaStream_t h) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    Stream* s = stream_of(h);
    run_until(s, s->issued);
}
// issue on h and wait for it: what a synchronous call does
static void enqueue_wait(cudaStream_t h, std::function<void()> fn) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    enqueue(h, std::move(fn));
    sync_stream(h);
}
static void sync_device() {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    run_until(&legacy_stream, legacy_stream.issued);
    for (Stream* s : live_streams) { run_until(s, s->issued); }
}

}  // namespace emu

using namespace emu;

// ---------------------------------------------------------------------------------------
// The CUDA runtime API (declared by the toolkit's cuda_runtime_api.h)

extern "C" {

cudaError_t cudaGetLastError(void) { cudaError_t e = last_error; last_error = cudaSuccess; return e; }
cudaError_t cudaPeekAtLastError(void) { return last_error; }
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        default: return "cuda emulator: unexpected error";
    }
}
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaError"; }

cudaError_t cudaGetDeviceCount(int* count) { *count = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int* device) { *device = 0; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { sync_device(); return cudaSuccess; }
cudaError_t cudaDeviceReset(void) { sync_device(); return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
    if (device != 0) { return cudaErrorInvalidDevice; }
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "CUDA emulator (CPU)");
    prop->major = 9;   // the bf16 build needs 8.0; the emulated instructions are those of sm_80/sm_90
    prop->minor = 0;
    prop->multiProcessorCount = 4;
    prop->l2CacheSize = 1 << 20;
    prop->totalGlobalMem = DEVICE_BYTES;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->maxThreadsPerBlock = 1024;
    prop->warpSize = 32;
    prop->maxThreadsDim[0] = 1024; prop->maxThreadsDim[1] = 1024; prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647; prop->maxGridSize[1] = 65535; prop->maxGridSize[2] = 65535;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
    (void)device;
    *value = 0;
    if (attr == cudaDevAttrComputeCapabilityMajor) { *value = 9; }
    else if (attr == cudaDevAttrMultiProcessorCount) { *value = 4; }
    else if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin) { *value = 227 * 1024; }
    // memory clock and bus width stay 0: no bandwidth figure means anything here
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
    (void)device;
    snprintf(bus, (size_t)len, "0000:00:00.0");   // every rank sees the same emulated GPU
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total) {
    *total = DEVICE_BYTES;
    *free_b = DEVICE_BYTES > device_bytes_in_use ? DEVICE_BYTES - device_bytes_in_use : 0;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > 227 * 1024) { return cudaErrorInvalidValue; }
        std::lock_guard<std::mutex> lock(launch_mutex);
        max_dynamic_smem[func] = value;
    }
    return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mem_mutex);
    if (device_bytes_in_use + bytes > DEVICE_BYTES) { *p = NULL; return cudaErrorMemoryAllocation; }
    // exact size (AddressSanitizer then catches one element past the end), 256-byte aligned as cudaMalloc
    if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) { *p = NULL; return cudaErrorMemoryAllocation; }
    memset(*p, 0xa5, bytes);   // not zero: like the GPU, fresh memory holds whatever was there
    device_allocs[(uintptr_t)*p] = bytes;
    device_bytes_in_use += bytes;
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (p == NULL) { return cudaSuccess; }
    sync_device();   // as on the GPU: queued work may still use it
    std::lock_guard<std::mutex> lock(mem_mutex);
    auto it = device_allocs.find((uintptr_t)p);
    if (it == device_allocs.end()) { return cudaErrorInvalidDevicePointer; }
    device_bytes_in_use -= it->second;
    device_allocs.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mem_mutex);
    if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) { *p = NULL; return cudaErrorMemoryAllocation; }
    pinned_allocs[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
    if (p == NULL) { return cudaSuccess; }
    sync_device();
    std::lock_guard<std::mutex> lock(mem_mutex);
    auto it = pinned_allocs.find((uintptr_t)p);
    if (it == pinned_allocs.end()) { return cudaErrorInvalidValue; }
    pinned_allocs.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) {
    std::lock_guard<std::mutex> lock(mem_mutex);
    memset(a, 0, sizeof(*a));
    if (find_alloc(device_allocs, p)) {
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = (void*)p;
    } else if (find_alloc(pinned_allocs, p)) {
        a->type = cudaMemoryTypeHost;
        a->hostPointer = (void*)p;
        a->devicePointer = (void*)p;
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->hostPointer = (void*)p;
    }
    return cudaSuccess;
}

// When the host waits, as CUDA documents it ("API synchronization behavior"): cudaMemcpy returns
// when the copy is done, except device to device (queued) and from plain (pageable) host memory
// to the device (the source is staged at once, the copy to the device queued);
// cudaMemcpyAsync returns when the copy is done only into pageable memory, stages a pageable
// source at once, and queues the rest; cudaMemset returns at once on device memory,
// cudaMemsetAsync unless the memory is pageable. A queued copy or memset runs when its stream
// gets to it. cudaMemcpy and cudaMemset use the legacy default stream.
static bool device_mem(const void* p) {
    std::lock_guard<std::mutex> lock(mem_mutex);
    return find_alloc(device_allocs, p);
}
static cudaError_t copy_on(cudaStream_t s, void* dst, const void* src, size_t bytes, bool sync_api) {
    bool dd = device_mem(dst), sd = device_mem(src), dp = !dd && pageable(dst), sp = !sd && pageable(src);
    bool wait = sync_api ? !(dd && (sd || sp)) : dp, stage = sp && !wait;
    if (stage) {   // the caller may reuse its buffer when the call returns
        std::shared_ptr<std::vector<char>> staged(new std::vector<char>((const char*)src, (const char*)src + bytes));
        enqueue(s, [dst, staged] { if (!staged->empty()) { memcpy(dst, staged->data(), staged->size()); } });
        return cudaSuccess;
    }
    std::function<void()> fn = [dst, src, bytes] { if (bytes) { memmove(dst, src, bytes); } };
    if (wait) { enqueue_wait(s, fn); }
    else { enqueue(s, fn); }
    return cudaSuccess;
}
static cudaError_t memset_on(cudaStream_t s, void* p, int value, size_t bytes, bool host_waits) {
    std::function<void()> fn = [p, value, bytes] { memset(p, value, bytes); };
    if (host_waits) { enqueue_wait(s, fn); }
    else { enqueue(s, fn); }
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
    (void)kind;
    return copy_on(0, dst, src, bytes, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)kind;
    return copy_on(s, dst, src, bytes, false);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return memset_on(0, p, value, bytes, !device_mem(p)); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) { return memset_on(s, p, value, bytes, pageable(p)); }

// streams and events: "Streams" above
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    Stream* st = new Stream;
    st->blocking = (flags & cudaStreamNonBlocking) == 0;
    live_streams.push_back(st);
    *s = (cudaStream_t)st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t h) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    Stream* s = stream_of(h);
    if (s == &legacy_stream) { return cudaErrorInvalidValue; }
    run_until(s, s->issued);   // its work completes, as on the GPU; what waits for it has nothing left to wait for
    live_streams.erase(std::remove(live_streams.begin(), live_streams.end(), s), live_streams.end());
    auto forget = [s](Stream* o) {
        for (Op& op : o->q) {
            op.after.erase(std::remove_if(op.after.begin(), op.after.end(), [s](const std::pair<Stream*, uint64_t>& a) {
                return a.first == s;
            }), op.after.end());
        }
    };
    forget(&legacy_stream);
    for (Stream* o : live_streams) { forget(o); }
    for (EmuEvent* e : live_events) { if (e->stream == s) { e->stream = NULL; } }
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { sync_stream(s); return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t s) { sync_stream(s); return cudaSuccess; }   // runs it: polling must end

static double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
static void event_wait(EmuEvent* e) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    if (e->stream != NULL) { run_until(e->stream, e->seq); }
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    EmuEvent* ev = new EmuEvent{0.0, NULL, 0};
    live_events.push_back(ev);
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) { (void)flags; return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    EmuEvent* ev = (EmuEvent*)e;
    event_wait(ev);   // its record must not run after it is gone
    live_events.erase(std::remove(live_events.begin(), live_events.end(), ev), live_events.end());
    delete ev;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    EmuEvent* ev = (EmuEvent*)e;
    enqueue(s, [ev] { ev->t = now_ms(); });
    ev->stream = stream_of(s);
    ev->seq = ev->stream->issued;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)flags;
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    EmuEvent* ev = (EmuEvent*)e;
    std::vector<std::pair<Stream*, uint64_t>> after;
    if (ev->stream != NULL) { after.push_back({ev->stream, ev->seq}); }   // never recorded: nothing to wait for
    enqueue_after(s, [] {}, after);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { event_wait((EmuEvent*)e); return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t e) { event_wait((EmuEvent*)e); return cudaSuccess; }   // runs it: polling must end
// host time between the two records: it says how long the emulation took, nothing about a GPU
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    event_wait((EmuEvent*)a);
    event_wait((EmuEvent*)b);
    *ms = (float)(((EmuEvent*)b)->t - ((EmuEvent*)a)->t);
    return cudaSuccess;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------
// cuBLASLt and cuBLAS: a reference GEMM in fp32 that honours transposes, leading dimensions,
// alpha, beta and the bias epilogue; bf16 outputs are rounded to nearest even. The sum over k
// runs in order, in fp32, where a tensor core adds in blocks: the last bits differ.

namespace emu {

static float load_elem(const void* p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) { return ((const float*)p)[i]; }
    if (t == CUDA_R_16BF) { return __bfloat162float(((const __nv_bfloat16*)p)[i]); }
    fatal("cuBLAS emulation: data type %d is not supported (fp32 and bf16 are)", (int)t);
}
static void store_elem(void* p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_32F) { ((float*)p)[i] = v; return; }
    if (t == CUDA_R_16BF) { ((__nv_bfloat16*)p)[i] = __float2bfloat16_rn(v); return; }
    fatal("cuBLAS emulation: data type %d is not supported (fp32 and bf16 are)", (int)t);
}

// dst[r * cols + c] = element (r, c) of src, which lies at src[r * ld + c] when row_major, else
// at src[c * ld + r]; read in the order it lies in memory
template <typename T>
static void pack(float* dst, const T* src, int rows, int cols, long ld, bool row_major) {
    if (row_major) {
        for (int r = 0; r < rows; r++) {
            for (int c = 0; c < cols; c++) { dst[(size_t)r * cols + c] = (float)src[(size_t)r * ld + c]; }
        }
    } else {
        for (int c = 0; c < cols; c++) {
            for (int r = 0; r < rows; r++) { dst[(size_t)r * cols + c] = (float)src[(size_t)c * ld + r]; }
        }
    }
}
static void pack(float* dst, const void* src, cudaDataType_t t, int rows, int cols, long ld, bool row_major) {
    if (t == CUDA_R_32F) { pack(dst, (const float*)src, rows, cols, ld, row_major); return; }
    if (t == CUDA_R_16BF) { pack(dst, (const __nv_bfloat16*)src, rows, cols, ld, row_major); return; }
    fatal("cuBLAS emulation: data type %d is not supported (fp32 and bf16 are)", (int)t);
}

// D(m,n) = alpha op(A) op(B) + beta C (+ bias[i]); column-major; op(A) is m x k
static void reference_gemm(int ta, int tb, int m, int n, int k, float alpha, const void* A, cudaDataType_t at, long lda,
                           const void* B, cudaDataType_t bt, long ldb, float beta, const void* C, cudaDataType_t ct,
                           long ldc, void* D, cudaDataType_t dt, long ldd, const void* bias, cudaDataType_t biast) {
    std::vector<float> a((size_t)m * k), b((size_t)k * n);   // op(A) row-major by i, op(B) by j
    pack(a.data(), A, at, m, k, lda, ta);    // op(A)(i, p) = ta ? A[i lda + p] : A[p lda + i]
    pack(b.data(), B, bt, n, k, ldb, !tb);   // op(B)(p, j) = tb ? B[p ldb + j] : B[j ldb + p]
#pragma omp parallel for schedule(static) if ((double)m * n * k >= 1 << 22)   // threads only where they pay
    for (int j = 0; j < n; j++) {
        const float* bj = &b[(size_t)j * k];
        for (int i0 = 0; i0 < m; i0 += 4) {   // four rows at once: four sums in flight, each added in order
            int rows = std::min(4, m - i0);
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (rows == 4) {
                const float *a0 = &a[(size_t)i0 * k], *a1 = a0 + k, *a2 = a1 + k, *a3 = a2 + k;
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
                for (int p = 0; p < k; p++) {
                    s0 += a0[p] * bj[p];
                    s1 += a1[p] * bj[p];
                    s2 += a2[p] * bj[p];
                    s3 += a3[p] * bj[p];
                }
                acc[0] = s0, acc[1] = s1, acc[2] = s2, acc[3] = s3;
            } else {
                for (int r = 0; r < rows; r++) {
                    const float* ai = &a[(size_t)(i0 + r) * k];
                    float s = 0.0f;
                    for (int p = 0; p < k; p++) { s += ai[p] * bj[p]; }
                    acc[r] = s;
                }
            }
            for (int r = 0; r < rows; r++) {
                int i = i0 + r;
                float v = alpha * acc[r];
                if (beta != 0.0f) { v += beta * load_elem(C, ct, (size_t)j * ldc + i); }
                if (bias) { v += load_elem(bias, biast, (size_t)i); }
                store_elem(D, dt, (size_t)j * ldd + i, v);
            }
        }
    }
}

struct LtDesc { cublasComputeType_t compute; int ta, tb; cublasLtEpilogue_t epi; const void* bias; cudaDataType_t bias_type; };
struct LtLayout { cudaDataType_t type; uint64_t rows, cols; int64_t ld; };

}  // namespace emu

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { *h = (cublasLtHandle_t) new char[1]; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete[] (char*)h; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (scale != CUDA_R_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    *d = (cublasLtMatmulDesc_t) new LtDesc{compute, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, NULL, CUDA_R_32F};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete (LtDesc*)d; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
    LtDesc* x = (LtDesc*)d;
    (void)size;
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA: { cublasOperation_t o; memcpy(&o, buf, sizeof(o)); x->ta = o != CUBLAS_OP_N; break; }
        case CUBLASLT_MATMUL_DESC_TRANSB: { cublasOperation_t o; memcpy(&o, buf, sizeof(o)); x->tb = o != CUBLAS_OP_N; break; }
        case CUBLASLT_MATMUL_DESC_EPILOGUE: memcpy(&x->epi, buf, sizeof(x->epi)); break;
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: memcpy(&x->bias, buf, sizeof(x->bias)); break;
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: memcpy(&x->bias_type, buf, sizeof(x->bias_type)); break;
        default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    if (ld < (int64_t)rows) { return CUBLAS_STATUS_INVALID_VALUE; }
    *l = (cublasLtMatrixLayout_t) new LtLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete (LtLayout*)l; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) { *p = (cublasLtMatmulPreference_t) new char[1]; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete[] (char*)p; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                                                    const void* buf, size_t size) {
    (void)p; (void)a; (void)buf; (void)size;
    return CUBLAS_STATUS_SUCCESS;
}
// one "algorithm": the reference GEMM
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
        cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p,
        int requested, cublasLtMatmulHeuristicResult_t results[], int* count) {
    (void)h; (void)d; (void)a; (void)b; (void)c; (void)dl; (void)p;
    *count = 0;
    if (requested < 1) { return CUBLAS_STATUS_INVALID_VALUE; }
    memset(&results[0], 0, sizeof(results[0]));
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
        cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const void* beta, const void* C,
        cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo, void* ws,
        size_t ws_bytes, cudaStream_t s) {
    (void)h; (void)algo; (void)ws; (void)ws_bytes; (void)s;
    const LtDesc* x = (const LtDesc*)desc;
    const LtLayout *a = (const LtLayout*)la, *b = (const LtLayout*)lb, *c = (const LtLayout*)lc, *d = (const LtLayout*)ld;
    int m = (int)d->rows, n = (int)d->cols;
    int k = x->ta ? (int)a->rows : (int)a->cols;
    int am = x->ta ? (int)a->cols : (int)a->rows;
    int bk = x->tb ? (int)b->cols : (int)b->rows, bn = x->tb ? (int)b->rows : (int)b->cols;
    if (am != m || bk != k || bn != n || c->rows != d->rows || c->cols != d->cols) { return CUBLAS_STATUS_INVALID_VALUE; }
    if (x->compute != CUBLAS_COMPUTE_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    const void* bias = NULL;
    if (x->epi == CUBLASLT_EPILOGUE_BIAS) {
        if (x->bias == NULL) { return CUBLAS_STATUS_INVALID_VALUE; }
        bias = x->bias;
    } else if (x->epi != CUBLASLT_EPILOGUE_DEFAULT) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    float al, be;
    memcpy(&al, alpha, 4);
    memcpy(&be, beta, 4);
    // queued on s with copies of what it reads from the descriptors (they may be gone when it runs)
    int ta = x->ta, tb = x->tb;
    cudaDataType_t bt_ = x->bias_type;
    LtLayout la_ = *a, lb_ = *b, lc_ = *c, ld_ = *d;
    enqueue(s, [=] {
        reference_gemm(ta, tb, m, n, k, al, A, la_.type, la_.ld, B, lb_.type, lb_.ld, be, C, lc_.type, lc_.ld, D, ld_.type,
                       ld_.ld, bias, bt_);
    });
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS (the kernel lab's matmul v3)
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) { *h = (cublasHandle_t) new char[1]; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) { delete[] (char*)h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) { (void)h; (void)mode; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
        const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb,
        const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)h; (void)algo;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32 && compute != CUBLAS_COMPUTE_32F_FAST_16BF) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    float al, be;
    memcpy(&al, alpha, 4);
    memcpy(&be, beta, 4);
    int ta_ = ta != CUBLAS_OP_N, tb_ = tb != CUBLAS_OP_N;
    enqueue(0, [=] {   // the handle's stream: cublasSetStream is not emulated, so the legacy stream
        reference_gemm(ta_, tb_, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc, C, ct, ldc, NULL, CUDA_R_32F);
    });
    return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------
// NCCL: cannot run without a GPU. Every emulated rank shares the one emulated GPU (the same
// PCI bus id), so llmc/comm takes the host-staged MPI wire and none of these is reached.

static ncclResult_t nccl_refuse(const char* call) {
    fflush(stdout);
    fprintf(stderr, "cuda emulator: %s: NCCL cannot run under the emulator (use the host-staged wire: LLMC_COMM_STAGED=1)\n", call);
    return ncclInvalidUsage;
}
const char* ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "NCCL is not available under the CUDA emulator";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { (void)id; return nccl_refuse("ncclGetUniqueId"); }
ncclResult_t ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId id, int r) { (void)c; (void)n; (void)id; (void)r; return nccl_refuse("ncclCommInitRank"); }
ncclResult_t ncclCommDestroy(ncclComm_t c) { (void)c; return nccl_refuse("ncclCommDestroy"); }
ncclResult_t ncclGroupStart(void) { return nccl_refuse("ncclGroupStart"); }
ncclResult_t ncclGroupEnd(void) { return nccl_refuse("ncclGroupEnd"); }
ncclResult_t ncclSend(const void* b, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t s) {
    (void)b; (void)n; (void)t; (void)p; (void)c; (void)s; return nccl_refuse("ncclSend");
}
ncclResult_t ncclRecv(void* b, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t s) {
    (void)b; (void)n; (void)t; (void)p; (void)c; (void)s; return nccl_refuse("ncclRecv");
}
ncclResult_t ncclAllReduce(const void* a, void* b, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t s) {
    (void)a; (void)b; (void)n; (void)t; (void)o; (void)c; (void)s; return nccl_refuse("ncclAllReduce");
}
ncclResult_t ncclReduce(const void* a, void* b, size_t n, ncclDataType_t t, ncclRedOp_t o, int r, ncclComm_t c, cudaStream_t s) {
    (void)a; (void)b; (void)n; (void)t; (void)o; (void)r; (void)c; (void)s; return nccl_refuse("ncclReduce");
}
ncclResult_t ncclBroadcast(const void* a, void* b, size_t n, ncclDataType_t t, int r, ncclComm_t c, cudaStream_t s) {
    (void)a; (void)b; (void)n; (void)t; (void)r; (void)c; (void)s; return nccl_refuse("ncclBroadcast");
}
ncclResult_t ncclReduceScatter(const void* a, void* b, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t s) {
    (void)a; (void)b; (void)n; (void)t; (void)o; (void)c; (void)s; return nccl_refuse("ncclReduceScatter");
}
ncclResult_t ncclAllGather(const void* a, void* b, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
    (void)a; (void)b; (void)n; (void)t; (void)c; (void)s; return nccl_refuse("ncclAllGather");
}

}  // extern "C"
