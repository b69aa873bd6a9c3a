// The calls a run makes, for test/test_syllabus.py's reading sets. The trainer is built with
// -finstrument-functions (Makefile: build/callgraph/train_gpt2cpu), so every function of its own
// sources calls __cyg_profile_func_enter on entry and __cyg_profile_func_exit on return; the
// library's code (std::thread, std::function, OpenMP, MPI) is not instrumented. This file, built
// without it, keeps a stack of the instrumented functions each thread is in, so a call's caller is
// the innermost function of ours that is running, also when the library stands between them (a
// thread's body, a std::function, a comparator); each distinct (caller, callee) pair is kept once
// and, at exit, written as hex addresses to $LLMC_CALLGRAPH.<pid> (nothing when it is unset).
// test/callgraph.py maps the addresses to functions with nm.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <atomic>

#define NO_TRACE __attribute__((no_instrument_function))
static const size_t SLOTS = 1 << 20;   // open addressing; a run makes a few thousand distinct pairs
static std::atomic<uintptr_t> caller_of[SLOTS], callee_of[SLOTS];
static std::atomic<int> full{0};

static const int DEPTH = 4096;
static thread_local uintptr_t stack[DEPTH];
static thread_local int depth = 0;

NO_TRACE static void callgraph_record(uintptr_t s, uintptr_t c);
extern "C" NO_TRACE void __cyg_profile_func_enter(void* callee, void*) {
    uintptr_t c = (uintptr_t)callee, s = depth > 0 ? stack[depth - 1] : 0;   // s: the caller (0: a thread's first)
    if (depth < DEPTH) { stack[depth] = c; }
    depth++;
    if (s) { callgraph_record(s, c); }
}
extern "C" NO_TRACE void __cyg_profile_func_exit(void*, void*) {
    if (depth > 0) { depth--; }
}

NO_TRACE static void callgraph_record(uintptr_t s, uintptr_t c) {
    static thread_local uintptr_t last_c, last_s;   // most calls repeat the one before (a loop's helper)
    if (c == last_c && s == last_s) { return; }
    last_c = c, last_s = s;
    size_t h = (size_t)((c * 0x9E3779B97F4A7C15ull) ^ (s * 0xC2B2AE3D27D4EB4Full)) & (SLOTS - 1);
    for (size_t probe = 0; probe < SLOTS; probe++, h = (h + 1) & (SLOTS - 1)) {
        uintptr_t cur = callee_of[h].load(std::memory_order_acquire);
        if (cur == 0) {   // claim the slot: the callee last, so that a reader never sees half a pair
            uintptr_t zero = 0;
            if (!caller_of[h].compare_exchange_strong(zero, s)) {
                if (zero != s) { continue; }   // another pair took it
                while ((cur = callee_of[h].load(std::memory_order_acquire)) == 0) {}
                if (cur == c) { return; }
                continue;
            }
            callee_of[h].store(c, std::memory_order_release);
            return;
        }
        if (cur == c && caller_of[h].load(std::memory_order_relaxed) == s) { return; }
    }
    full.store(1);
}

NO_TRACE static void callgraph_write() {
    const char* base = getenv("LLMC_CALLGRAPH");
    if (!base) { return; }
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d", base, (int)getpid());
    FILE* f = fopen(path, "w");
    if (!f) { return; }
    if (full.load()) { fprintf(f, "full\n"); }
    for (size_t i = 0; i < SLOTS; i++) {
        uintptr_t c = callee_of[i].load();
        if (c) { fprintf(f, "%lx %lx\n", (unsigned long)caller_of[i].load(), (unsigned long)c); }
    }
    fclose(f);
}
__attribute__((constructor)) NO_TRACE static void callgraph_start() { atexit(callgraph_write); }
